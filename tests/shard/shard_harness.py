"""Multi-process harness of the sharder tests: one process per rank, gloo on
the CPU or NCCL with one GPU per rank (``run_world(..., device_type="cuda")``),
a free port, and timeouts so that a hang fails the test instead of blocking it.

The ranks of a CPU world are forked by a forkserver that imported torch,
TorchRec and dynamicemb once (``world_preload.py``): a world starts in a
fraction of a second instead of each rank importing them anew (seconds of
CPU per rank). Each rank is still a new process with the caller's
environment, working directory and ``sys.path``; what the ranks print is
written to the caller's stderr when the world ends. NCCL ranks are spawned
(CUDA is never initialized before they start either way). ``Process`` runs
a function in a process forked so, outside any world.

Scenarios run in the workers (``run_scenarios``) build a model with an
EmbeddingCollection or EmbeddingBagCollection, shard it with
DistributedModelParallel and the dynamicemb sharders, train a few steps and
return each step's local outputs. ``reference_outputs`` computes the same
outputs with a dense float64 model in one process.
"""

import contextlib
import dataclasses
import io
import os
import queue
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dist_launch  # examples/dist_launch.py (pyproject: pytest pythonpath)
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# --------------------------------------------------------------- processes --

RUN_TIMEOUT_S = 240.0


def worker_device() -> torch.device:
    """The device of this rank: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in its dicts, lists and tuples moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def _worker(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable,
    args: tuple,
    results,
    device_type: str = "cpu",
    forked: tuple[dict[str, str], str] | None = None,
) -> None:
    if forked is not None:
        _take_callers_place(*forked)
    torch.set_num_threads(1)
    try:
        dist_launch.init_process_group(rank, world_size, port, device_type, 1, timeout_s=90)
        out = to_cpu(fn(rank, world_size, *args))
        # Bytes, not tensors: a tensor in a queue is shared memory that dies
        # with this process.
        buffer = io.BytesIO()
        torch.save(out, buffer)
        results.put((rank, "ok", buffer.getvalue()))
    except BaseException:  # reported to the parent, which fails the test
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist_launch.tear_down()


def _take_callers_place(environ: dict[str, str], output: str) -> None:
    """In a process the forkserver forked: the environment of the process that
    asked for it, and stdout and stderr appended to ``output`` (the caller shows
    it: the forkserver's own are those of whatever test started it)."""
    os.environ.clear()
    os.environ.update(environ)
    fd = os.open(output, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _forked_state() -> tuple[dict[str, str], str]:
    """What ``_take_callers_place`` needs: this environment and a new output file."""
    fd, output = tempfile.mkstemp(prefix="dynamicemb-test-", suffix=".log")
    os.close(fd)
    return dict(os.environ), output


def _read_output(output: str) -> str:
    with open(output, errors="replace") as f:
        text = f.read()
    os.unlink(output)
    return text


def _run_forked(fn: Callable, args: tuple, forked: tuple[dict[str, str], str]) -> None:
    _take_callers_place(*forked)
    fn(*args)


class Process:
    """``fn(*args)`` in a process forked as a CPU world's ranks are (the
    caller's environment, torch, TorchRec and dynamicemb imported), not a rank
    of a world; ``join`` gives its exit code and output."""

    def __init__(self, fn: Callable, *args: Any) -> None:
        self._forked = _forked_state()
        self._process = _context("cpu").Process(
            target=_run_forked, args=(fn, args, self._forked), daemon=True
        )
        self._process.start()

    def join(self, timeout: float) -> tuple[int | None, str]:
        """Waits up to ``timeout`` seconds. Returns (exit code, negative for a
        signal; None when it was still running, then it is killed), output."""
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            self._process.kill()
            self._process.join(10)
        return code, _read_output(self._forked[1])


def _context(device_type: str):
    """The start method of a world's ranks: a forkserver with torch, TorchRec
    and dynamicemb imported for CPU worlds (started with the first one), spawn
    for NCCL worlds."""
    if device_type != "cpu":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.shard.world_preload"])
    return ctx


def run_world(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout: float = RUN_TIMEOUT_S,
    device_type: str = "cpu",
) -> list[Any]:
    """Runs ``fn(rank, world_size, *args)`` on ``world_size`` ranks: gloo
    processes on the CPU, or (``device_type="cuda"``) NCCL processes, rank r
    on GPU r. ``fn`` finds its device with ``worker_device()``.

    Returns:
        List[Any]: each rank's return value, by rank, tensors on the CPU.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message) or the
            run did not finish within ``timeout`` seconds.
    """
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if device_type == "cuda" and world_size > torch.cuda.device_count():
        raise RuntimeError(
            f"{world_size} ranks need {world_size} GPUs, {torch.cuda.device_count()} visible"
        )
    ctx = _context(device_type)
    results = ctx.Queue()
    port = dist_launch.free_port()
    forked = _forked_state() if ctx.get_start_method() == "forkserver" else None
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, fn, args, results, device_type, forked),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    outs: dict[int, Any] = {}
    errors: list[str] = []
    try:
        import time

        deadline = time.monotonic() + timeout
        while len(outs) + len(errors) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"world of {world_size} ranks did not finish within {timeout} s")
            try:
                rank, status, payload = results.get(timeout=min(left, 5.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    raise RuntimeError(f"ranks {dead} died without a result") from None
                continue
            if status == "ok":
                outs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{payload}")
                break
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if forked is not None:
            sys.stderr.write(_read_output(forked[1]))
    if errors:
        raise RuntimeError("\n".join(errors))
    return [outs[r] for r in range(world_size)]


# --------------------------------------------------------------- scenarios --


@dataclass
class TableSpec:
    """One table of a scenario's collection (a single feature per table)."""

    name: str
    num_embeddings: int
    dim: int
    dynamic: bool = True
    dist_type: str = "roundrobin"
    pooling: str = "SUM"  # EmbeddingBagCollection only: SUM or MEAN
    static_sharding: str = "row_wise"  # static tables: row_wise or table_wise
    initializer: str = "debug"  # dynamic tables: debug or uniform
    # Dynamic tables: FrequencyAdmissionStrategy(admit_threshold) with a counter
    # share of 1024 slots; None admits every key.
    admit_threshold: int | None = None
    # dynamic tables: more DynamicEmbTableOptions fields (storage tiers, dtype)
    options: dict = dataclasses.field(default_factory=dict)

    @property
    def feature(self) -> str:
        return f"f_{self.name}"


@dataclass
class Scenario:
    """A sharded training run: its model, optimizer and batches."""

    name: str
    kind: str  # "ec" or "ebc"
    tables: list[TableSpec]
    optimizer: str = "sgd"  # sgd, adam or rmsprop_ar (RMSPROP_AR below)
    learning_rate: float = 0.1
    steps: int = 3
    batch_size: int = 3
    max_length: int = 4
    key_range: tuple[int, int] = (-6, 30)
    use_index_dedup: bool = False
    weighted: bool = False
    seq_weights: bool = False  # EC: attach integer weights (frequency counters)
    use_planner: bool = False
    eval_step: bool = True


def batch_for(scenario: Scenario, step: int, rank: int):
    """The local batch of ``rank`` at ``step``: per feature, per sample, keys
    (and weights). Static tables get keys in [0, num_embeddings)."""
    g = torch.Generator().manual_seed(1000 * step + 17 * rank + 3)
    batch = {}
    for t in scenario.tables:
        lo, hi = scenario.key_range if t.dynamic else (0, t.num_embeddings)
        samples = []
        for _ in range(scenario.batch_size):
            n = int(torch.randint(0, scenario.max_length + 1, (1,), generator=g))
            keys = torch.randint(lo, hi, (n,), generator=g)
            weights = torch.rand(n, generator=g) + 0.5
            if scenario.seq_weights:
                weights = torch.randint(1, 4, (n,), generator=g).float()
            samples.append((keys, weights))
        batch[t.feature] = samples
    return batch


def to_kjt(scenario: Scenario, batch):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys, values, lengths, weights = [], [], [], []
    for t in scenario.tables:
        keys.append(t.feature)
        for k, w in batch[t.feature]:
            values.append(k)
            weights.append(w)
            lengths.append(k.numel())
    with_weights = scenario.weighted or scenario.seq_weights
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values).long(),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        weights=torch.cat(weights).float() if with_weights else None,
    )


def targets_for(scenario: Scenario, step: int, rank: int, shapes: dict[str, tuple[int, ...]]):
    """Deterministic regression targets of a rank's outputs."""
    g = torch.Generator().manual_seed(7919 * step + 31 * rank + 1)
    return {
        name: torch.randn(shape, generator=g, dtype=torch.float64)
        for name, shape in sorted(shapes.items())
    }


def initializer_args(spec: TableSpec):
    from dynamicemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode

    if spec.initializer == "debug":
        return DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)
    return DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.5, upper=0.5)


# Row-wise RMSprop AR's hyper-parameters in the rmsprop_ar scenarios: a strong
# decay and a warm-up, so that the steps between a row's updates and its
# updates so far both show in the outputs.
RMSPROP_AR = {"ar_alpha": 0.8, "ema_beta": 0.9, "min_shrinkage": 0.3, "row_warmup_steps": 2}


def fused_params(scenario: Scenario) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb import DynamicEmbOptimType

    if scenario.optimizer == "rmsprop_ar":
        return {
            "optimizer": DynamicEmbOptimType.ROWWISE_RMSPROP_AR,
            "learning_rate": scenario.learning_rate,
            "eps": 1e-8,
            **RMSPROP_AR,
        }
    if scenario.optimizer == "sgd":
        return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": scenario.learning_rate}
    if scenario.optimizer == "adam":
        return {
            "optimizer": EmbOptimType.ADAM,
            "learning_rate": scenario.learning_rate,
            "eps": 1e-8,
            "beta1": 0.9,
            "beta2": 0.999,
        }
    raise ValueError(f"unknown optimizer {scenario.optimizer!r}")


def build_collection(scenario: Scenario, device: torch.device):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    torch.manual_seed(0)  # static tables: the same initial weights everywhere
    if scenario.kind == "ec":
        configs = [
            EmbeddingConfig(
                name=t.name,
                num_embeddings=t.num_embeddings,
                embedding_dim=t.dim,
                feature_names=[t.feature],
            )
            for t in scenario.tables
        ]
        return EmbeddingCollection(tables=configs, device=device)
    configs = [
        EmbeddingBagConfig(
            name=t.name,
            num_embeddings=t.num_embeddings,
            embedding_dim=t.dim,
            feature_names=[t.feature],
            pooling=PoolingType[t.pooling],
        )
        for t in scenario.tables
    ]
    return EmbeddingBagCollection(tables=configs, is_weighted=scenario.weighted, device=device)


def table_options(spec: TableSpec, world_size: int):
    from torchrec.modules.embedding_configs import EmbeddingConfig

    from dynamicemb import DynamicEmbTableOptions, get_sharded_table_capacity

    config = EmbeddingConfig(
        name=spec.name, num_embeddings=spec.num_embeddings, embedding_dim=spec.dim
    )
    admit_strategy = None
    if spec.admit_threshold is not None:
        from dynamicemb import FrequencyAdmissionStrategy, KVCounter

        admit_strategy = FrequencyAdmissionStrategy(
            spec.admit_threshold, KVCounter(1024, bucket_capacity=128)
        )
    return DynamicEmbTableOptions(
        dim=spec.dim,
        max_capacity=get_sharded_table_capacity(config, world_size, 128),
        bucket_capacity=128,
        initializer_args=initializer_args(spec),
        dist_type=spec.dist_type,
        admit_strategy=admit_strategy,
        **spec.options,
    )


def sharder_for(scenario: Scenario):
    from dynamicemb.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
    )

    if scenario.kind == "ec":
        return DynamicEmbeddingCollectionSharder(
            fused_params=fused_params(scenario),
            static_fused_params=fused_params(scenario),
            use_index_dedup=scenario.use_index_dedup,
        )
    return DynamicEmbeddingBagCollectionSharder(
        fused_params=fused_params(scenario), static_fused_params=fused_params(scenario)
    )


def hand_plan(scenario: Scenario, collection, sharder, world_size: int, device_type: str = "cpu"):
    """A plan built with TorchRec's helpers, dynamic entries swapped in."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.sharding_plan import (
        construct_module_sharding_plan,
        row_wise,
        table_wise,
    )

    from dynamicemb.planner.parameter_sharding import DynamicEmbParameterSharding

    per_param = {}
    for t in scenario.tables:
        if t.dynamic:
            per_param[t.name] = row_wise(
                compute_kernel=EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
            )
        elif t.static_sharding == "table_wise":
            per_param[t.name] = table_wise(
                rank=world_size - 1, compute_kernel=EmbeddingComputeKernel.FUSED.value
            )
        else:
            per_param[t.name] = row_wise(compute_kernel=EmbeddingComputeKernel.FUSED.value)
    plan = construct_module_sharding_plan(
        collection,
        per_param,
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type=device_type,
    )
    for t in scenario.tables:
        if t.dynamic:
            ps = plan[t.name]
            fields = {f.name: getattr(ps, f.name) for f in dataclasses.fields(ps)}
            plan[t.name] = DynamicEmbParameterSharding(
                **fields, dynamicemb_options=table_options(t, world_size)
            )
    return plan


def scenario_planner(scenario: Scenario, collection, world_size: int, device_type: str = "cpu"):
    """A DynamicEmbeddingShardingPlanner of the scenario's tables: dynamic
    tables row-wise with their options (capacity and dim left to the planner),
    static ones by their sharding."""
    from torchrec.distributed.planner import Topology

    from dynamicemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints

    constraints = {}
    for t in scenario.tables:
        if t.dynamic:
            options = table_options(t, world_size)
            options = dataclasses.replace(options, max_capacity=None, dim=None)
            constraints[t.name] = DynamicEmbParameterConstraints(
                sharding_types=["row_wise"], use_dynamicemb=True, dynamicemb_options=options
            )
        else:
            constraints[t.name] = DynamicEmbParameterConstraints(
                sharding_types=[t.static_sharding], compute_kernels=["fused"]
            )
    configs = (
        collection.embedding_configs()
        if scenario.kind == "ec"
        else collection.embedding_bag_configs()
    )
    return DynamicEmbeddingShardingPlanner(
        eb_configs=configs,
        topology=Topology(
            world_size=world_size, compute_device=device_type, local_world_size=world_size
        ),
        constraints=constraints,
        batch_size=scenario.batch_size,
    )


class ScenarioModel(torch.nn.Module):
    """A model of one collection, at ``coll``."""

    def __init__(self, collection) -> None:
        super().__init__()
        self.coll = collection

    def forward(self, kjt):
        return self.coll(kjt)


def local_outputs(scenario: Scenario, out) -> dict[str, torch.Tensor]:
    if scenario.kind == "ec":
        return {f: out[f].values() for f in sorted(out.keys())}
    return {"pooled": out.values()}


def sharded_model(scenario: Scenario, world_size: int, pg=None):
    """The scenario's model sharded by DistributedModelParallel on
    ``worker_device()`` (the collection at ``coll``) over ``pg`` (default: the
    world), and its plan: made by ``plan_and_shard`` for a scenario
    ``use_planner``, else by hand."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from dynamicemb.shard import plan_and_shard

    device = worker_device()
    collection = build_collection(scenario, torch.device("cpu"))
    sharder = sharder_for(scenario)
    if scenario.use_planner:
        planner = scenario_planner(scenario, collection, world_size, device.type)
        return plan_and_shard(ScenarioModel(collection), planner, [sharder], device, pg)
    plan = ShardingPlan({"coll": hand_plan(scenario, collection, sharder, world_size, device.type)})
    model = DistributedModelParallel(
        ScenarioModel(collection),
        env=ShardingEnv.from_process_group(pg or dist.group.WORLD),
        device=device,
        plan=plan,
        sharders=[sharder],
    )
    return model, plan


def run_scenario(
    rank: int,
    world_size: int,
    scenario: Scenario,
    before_backward: Callable | None = None,
    step_context: Callable | None = None,
    pg=None,
) -> dict[str, Any]:
    """Shards the scenario's model over ``pg`` (default: the world; ``rank``
    and ``world_size`` are this rank's place in it), trains ``steps`` steps;
    returns the local outputs of every step (float64 on the CPU) and of a
    final eval step.
    ``step_context(step)``, when given, is a context manager each training
    step's forward and backward run in.

    Runs on ``worker_device()``. The unsharded collection is built on the
    CPU either way, so static tables start from the reference's weights
    (TorchRec's sharded collection copies them to the device).
    ``before_backward(model, step)``, when given, runs between each step's
    forward and backward (where TorchRec's prefetch pipeline prefetches)."""
    device = worker_device()
    model, plan = sharded_model(scenario, world_size, pg)
    steps = []
    for step in range(scenario.steps):
        kjt = to_kjt(scenario, batch_for(scenario, step, rank)).to(device)
        with step_context(step) if step_context is not None else contextlib.nullcontext():
            outs = local_outputs(scenario, model(kjt))
            if before_backward is not None:
                before_backward(model, step)
            shapes = {k: tuple(v.shape) for k, v in outs.items()}
            targets = targets_for(scenario, step, rank, shapes)
            loss = sum(
                0.5 * ((v.double() - targets[k].to(device)) ** 2).sum() for k, v in outs.items()
            )
            loss.backward()
        steps.append({k: v.detach().double().cpu().clone() for k, v in outs.items()})
    result = {"steps": steps, "plan_kernels": {}, "admission": _admission_counts(model)}
    for name, ps in plan.plan["coll"].items():
        result["plan_kernels"][name] = (ps.sharding_type, ps.compute_kernel, type(ps).__name__)
    if scenario.eval_step:
        model.eval()
        with torch.no_grad():
            kjt = to_kjt(scenario, batch_for(scenario, scenario.steps, rank)).to(device)
            result["eval"] = {
                k: v.double().cpu().clone() for k, v in local_outputs(scenario, model(kjt)).items()
            }
    return result


def _admission_counts(model) -> dict[str, Any]:
    """This rank's admission counts of each dynamic table with an admitter
    ([admitted, rejected]), and the thresholds of its modules."""
    from dynamicemb.shard import dynamic_embedding_kernels
    from dynamicemb.storage.stats import StatCol

    counts, modules = {}, []
    for kernel in dynamic_embedding_kernels(model):
        m = kernel.emb_module
        if m.admitter is None:
            continue
        modules.append((tuple(kernel.table_names), m.admitter.threshold))
        for t, name in enumerate(kernel.table_names):
            counts[name] = m.stats.counts[t, [StatCol.ADMISSIONS, StatCol.REJECTIONS]].cpu()
    return {"counts": counts, "modules": sorted(modules)}


def run_scenarios(rank: int, world_size: int, scenarios: list[Scenario]) -> dict[str, Any]:
    return {s.name: run_scenario(rank, world_size, s) for s in scenarios}


# --------------------------------------------------------------- reference --


class _DenseTable:
    """A float64 table of one key space: rows created on first use."""

    def __init__(self, spec: TableSpec, table_id: int, static_weight: torch.Tensor | None) -> None:
        self.spec = spec
        self.table_id = table_id
        self.static_weight = static_weight
        self.rows: dict[int, torch.Tensor] = {}
        self.state: dict[int, Any] = {}  # Adam's (m, v); RMSprop AR's state
        # Admission: the counts of keys waiting, and per step the keys kept out.
        self.waiting: dict[int, int] = {}
        self.rejected: set[int] = set()
        self.admission = [0, 0]  # admitted, rejected

    def initial_row(self, key: int) -> torch.Tensor:
        from dynamicemb.embedding import init_rows

        r = init_rows(
            torch.tensor([key]),
            self.spec.dim,
            initializer_args(self.spec),
            torch.tensor([self.table_id]),
            0,
        )
        return r[0].double()

    def row(self, key: int) -> torch.Tensor:
        if key not in self.rows:
            if self.static_weight is not None:
                self.rows[key] = self.static_weight[key].double().clone()
            else:
                self.rows[key] = self.initial_row(key)
        return self.rows[key]

    def admit(self, occurrences: dict[int, int]) -> None:
        """A training step's admission: each missing key's count grows by its
        occurrences (over all ranks: all of them reach the key's rank); at
        the threshold the key is admitted, else it is rejected this step."""
        self.rejected = set()
        if self.spec.admit_threshold is None:
            return
        for key, n in occurrences.items():
            if key in self.rows:
                continue
            count = self.waiting.pop(key, 0) + n
            if count >= self.spec.admit_threshold:
                self.admission[0] += 1
            else:
                self.waiting[key] = count
                self.rejected.add(key)
                self.admission[1] += 1


def reference_outputs(scenario: Scenario, world_size: int) -> dict[str, Any]:
    """The outputs every rank should see, from a dense float64 model.

    Gradients are those of the mean of the ranks' losses (TorchRec divides the
    embedding gradients by the world size in its all-to-all backward).
    """
    collection = build_collection(scenario, torch.device("cpu"))
    state = collection.state_dict()
    prefix = "embeddings" if scenario.kind == "ec" else "embedding_bags"
    # Initializer table id: the table's position among the collection's
    # dynamic tables, whatever module TorchRec fuses it into (SUM and MEAN
    # tables land in different ones).
    dynamic_ids: dict[str, int] = {}
    for t in scenario.tables:
        if t.dynamic:
            dynamic_ids[t.name] = len(dynamic_ids)
    tables = {
        t.name: _DenseTable(
            t,
            dynamic_ids.get(t.name, 0),
            None if t.dynamic else state[f"{prefix}.{t.name}.weight"],
        )
        for t in scenario.tables
    }
    per_rank_steps: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(world_size)]
    for step in range(scenario.steps + (1 if scenario.eval_step else 0)):
        training = step < scenario.steps
        batches = [batch_for(scenario, step, r) for r in range(world_size)]
        if training:
            for t in scenario.tables:
                occurrences: dict[int, int] = {}
                for batch in batches:
                    for keys, _ in batch[t.feature]:
                        for k in keys.tolist():
                            occurrences[k] = occurrences.get(k, 0) + 1
                tables[t.name].admit(occurrences)
        # Leaf tensors of the rows this step touches.
        leaves: dict[tuple[str, int], torch.Tensor] = {}
        for batch in batches:
            for t in scenario.tables:
                for keys, _ in batch[t.feature]:
                    for k in keys.tolist():
                        if (t.name, k) not in leaves:
                            if training and k in tables[t.name].rejected:
                                # Read, not stored, not trained.
                                base = tables[t.name].initial_row(k)
                            elif training or k in tables[t.name].rows or not t.dynamic:
                                base = tables[t.name].row(k)
                            else:  # eval: an unseen key reads the eval initializer (0.0)
                                base = torch.zeros(t.dim, dtype=torch.float64)
                            leaves[(t.name, k)] = base.clone().requires_grad_(training)
        total = torch.zeros((), dtype=torch.float64)
        for r, batch in enumerate(batches):
            outs = _dense_forward(scenario, batch, leaves)
            if training:
                targets = targets_for(
                    scenario, step, r, {k: tuple(v.shape) for k, v in outs.items()}
                )
                total = total + sum(0.5 * ((v - targets[k]) ** 2).sum() for k, v in outs.items())
            per_rank_steps[r].append({k: v.detach().clone() for k, v in outs.items()})
        if not training:
            break
        (total / world_size).backward()
        for (name, k), leaf in leaves.items():
            if leaf.grad is None or k in tables[name].rejected:
                continue
            _apply(scenario, tables[name], k, leaf.grad, step + 1)
    admission = {
        t.name: tables[t.name].admission for t in scenario.tables if t.admit_threshold is not None
    }
    result = []
    for r in range(world_size):
        entry = {"steps": per_rank_steps[r][: scenario.steps], "admission": admission}
        if scenario.eval_step:
            entry["eval"] = per_rank_steps[r][scenario.steps]
        result.append(entry)
    return result


def _dense_forward(scenario: Scenario, batch, leaves) -> dict[str, torch.Tensor]:
    if scenario.kind == "ec":
        outs = {}
        for t in scenario.tables:
            rows = [leaves[(t.name, k)] for keys, _ in batch[t.feature] for k in keys.tolist()]
            outs[t.feature] = (
                torch.stack(rows) if rows else torch.zeros(0, t.dim, dtype=torch.float64)
            )
        return dict(sorted(outs.items()))
    cols = []
    for t in scenario.tables:
        pooled = []
        for keys, weights in batch[t.feature]:
            acc = torch.zeros(t.dim, dtype=torch.float64)
            for k, w in zip(keys.tolist(), weights.double()):
                acc = acc + (w if scenario.weighted else 1.0) * leaves[(t.name, k)]
            if t.pooling == "MEAN" and keys.numel():
                acc = acc / keys.numel()
            pooled.append(acc)
        cols.append(torch.stack(pooled))
    return {"pooled": torch.cat(cols, dim=1)}


def _apply(scenario: Scenario, table: _DenseTable, key: int, grad: torch.Tensor, step: int) -> None:
    lr = scenario.learning_rate
    w = table.rows[key] if key in table.rows else table.row(key)
    if scenario.optimizer == "sgd":
        table.rows[key] = w - lr * grad
        return
    if scenario.optimizer == "rmsprop_ar":
        from types import SimpleNamespace

        from tests.embedding.optimizer_reference import rmsprop_ar_step

        opt = SimpleNamespace(learning_rate=lr, eps=1e-8, **RMSPROP_AR)
        s = table.state.get(key, torch.zeros(4, dtype=torch.float64))
        table.rows[key], table.state[key] = rmsprop_ar_step(opt, w, s, grad, step)
        return
    b1, b2, eps = 0.9, 0.999, 1e-8
    m, v = table.state.get(key, (torch.zeros_like(w), torch.zeros_like(w)))
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    table.state[key] = (m, v)
    table.rows[key] = w - lr * (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)


def assert_matches(
    got: dict[str, Any], want: dict[str, Any], rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    assert len(got["steps"]) == len(want["steps"])
    for step, (g, w) in enumerate(zip(got["steps"], want["steps"])):
        assert sorted(g) == sorted(w), (step, sorted(g), sorted(w))
        for k in w:
            torch.testing.assert_close(
                g[k], w[k], rtol=rtol, atol=atol, msg=lambda m: f"step {step} {k}: {m}"
            )
    if "eval" in want:
        for k in want["eval"]:
            torch.testing.assert_close(
                got["eval"][k],
                want["eval"][k],
                rtol=rtol,
                atol=atol,
                msg=lambda m: f"eval {k}: {m}",
            )
