"""Rows in e4m3fn against rows in e5m2: what the second FP8 format would give.

    PYTHONPATH=. python tools/bench/fp8_formats.py [--seeds 8] [--dim 128]

The tables store FP8 rows as ``torch.float8_e4m3fn`` codes and a per-row
power-of-two scale (docs/storage.md); ``torch.float8_e5m2`` is refused. Both
formats take a byte a value, so e5m2 can only pay in accuracy: two more
exponent bits (range) for one mantissa bit less (precision). This measures
both, with the same row scale rule (max |value| / scale in (max / 2, max],
max the format's largest value: 448, 57344) and torch's own casts:

1. the error of a row rounded to nearest: rows of ``--dim`` values drawn
   N(0, 1) and with a heavy tail (Student t, 3 degrees of freedom), the RMS
   of (decoded - value) / RMS(value);
2. training: the regression of tests/storage/test_fp8_training.py (each of 64
   keys learns a fixed target row of dim 8 by SGD, batches of 32 keys, one
   key a bag), the loss of the last five steps over the first five, mean of
   ``--seeds`` seeds: float32 and e4m3fn through the library's table, and a
   model in PyTorch of the table's write (the float32 update, the new row's
   scale, each value rounded stochastically to one of its two neighbouring
   codes) for float32, e4m3fn and e5m2. Its e4m3fn against the table's
   checks the model. Two learning rates: 0.3 (the test's) and 0.01 (600
   steps; most updates are below half a code's step).
"""

import argparse
import statistics

import torch

from dynamicemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, DynamicEmbTableOptions
from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

# (mantissa bits, smallest normal exponent, largest value) of each format.
FORMATS = {
    torch.float8_e4m3fn: (3, -6, 448.0),
    torch.float8_e5m2: (2, -14, 57344.0),
}
NAMES = {torch.float32: "float32", torch.float8_e4m3fn: "e4m3fn", torch.float8_e5m2: "e5m2"}
INIT = 0.5  # rows start uniform in [-INIT, INIT], as the test's tables


def row_scale(rows: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """Each row's power of two s with max |value| / s in (max / 2, max]."""
    amax = rows.abs().amax(1, keepdim=True).double()
    m, e = torch.frexp(amax / FORMATS[fmt][2])
    s = torch.ldexp(torch.ones_like(amax), e - (m == 0.5).int())
    return torch.where(amax > 0, s, torch.ones_like(s))


def nearest(rows: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """Rows as stored with round to nearest (torch's cast), decoded."""
    s = row_scale(rows, fmt)
    return ((rows.double() / s).to(fmt).double() * s).float()


def stochastic(rows: torch.Tensor, fmt: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Rows as stored with stochastic rounding, decoded: each value / scale
    goes to the code above its magnitude with probability (its distance from
    the code below) / (the codes' step); the result is checked to be a code
    (torch's cast leaves it as it is)."""
    mbits, emin, _ = FORMATS[fmt]
    s = row_scale(rows, fmt)
    x = rows.double() / s
    a = x.abs()
    _, e = torch.frexp(a.clamp(min=2.0**emin))  # a in [2^(e-1), 2^e)
    step = torch.ldexp(torch.ones_like(a), e - 1 - mbits)
    below = torch.floor(a / step) * step
    up = torch.rand(a.shape, generator=g, dtype=torch.float64) < (a - below) / step
    q = torch.sign(x) * (below + up * step)
    assert torch.equal(q.to(fmt).double(), q)
    return (q * s).float()


def rounding_error(dim: int, fmt: torch.dtype, tail: bool) -> float:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(4096, dim, generator=g, dtype=torch.float64)
    if tail:  # Student t with 3 degrees of freedom
        chi2 = torch.randn(4096, dim, 3, generator=g, dtype=torch.float64).pow(2).sum(-1)
        rows = rows / (chi2 / 3).sqrt()
    rows = rows.float()
    err = (nearest(rows, fmt) - rows).double()
    return float(err.pow(2).mean().sqrt() / rows.double().pow(2).mean().sqrt())


def regression(dtype, seed: int, lr: float, steps: int, library: bool) -> float:
    """Loss of the last five steps over the first five."""
    dim, vocab, batch = 8, 64, 32
    targets = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(100 + seed)) * 0.1
    g = torch.Generator().manual_seed(200 + seed)
    if library:
        options = DynamicEmbTableOptions(
            dim=dim,
            max_capacity=4096,
            bucket_capacity=128,
            embedding_dtype=dtype,
            initializer_args=DynamicEmbInitializerArgs(
                mode=DynamicEmbInitializerMode.UNIFORM, lower=-INIT, upper=INIT
            ),
        )
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        m = BatchedDynamicEmbeddingTablesV2(
            [options], pooling_mode=Pool.SUM, optimizer=EmbOptimType.EXACT_SGD, learning_rate=lr
        )
        torch.manual_seed(300 + seed)  # the table's initializer
    else:
        rg = torch.Generator().manual_seed(300 + seed)
        rows = (torch.rand(vocab, dim, generator=rg) * 2 - 1) * INIT
        if dtype != torch.float32:
            rows = stochastic(rows, dtype, rg)
    losses = []
    for _ in range(steps):
        keys = torch.randperm(vocab, generator=g)[:batch]
        if library:
            out = m(keys, torch.arange(batch + 1))
            loss = 0.5 * ((out - targets[keys]) ** 2).sum()
            loss.backward()
        else:
            out = rows[keys]
            loss = 0.5 * ((out - targets[keys]) ** 2).sum()
            new = out - torch.tensor(lr) * (out - targets[keys])  # float32 SGD
            rows[keys] = new if dtype == torch.float32 else stochastic(new, dtype, rg)
        losses.append(float(loss.detach()))
    return sum(losses[-5:]) / sum(losses[:5])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128, help="row width of the rounding error")
    args = ap.parse_args()
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    print(f"rounding to nearest, RMS error / RMS value, rows of dim {args.dim}:")
    print("| rows | e4m3fn | e5m2 |\n|---|---|---|")
    for tail in (False, True):
        errs = [f"{rounding_error(args.dim, f, tail):.4f}" for f in fp8]
        print(f"| {'Student t (3)' if tail else 'N(0, 1)'} | {' | '.join(errs)} |")
    print(f"\nSGD regression, loss of the last 5 steps / the first 5, mean of {args.seeds} seeds:")
    print("| learning rate, steps | rows | library | PyTorch model |\n|---|---|---|---|")
    for lr, steps in ((0.3, 60), (0.01, 600)):
        for dtype in (torch.float32, *fp8):
            lib = "-"
            if dtype != torch.float8_e5m2:
                lib = statistics.mean(
                    regression(dtype, s, lr, steps, True) for s in range(args.seeds)
                )
                lib = f"{lib:.3e}"
            ref = statistics.mean(regression(dtype, s, lr, steps, False) for s in range(args.seeds))
            print(f"| {lr}, {steps} | {NAMES[dtype]} | {lib} | {ref:.3e} |")


if __name__ == "__main__":
    main()
