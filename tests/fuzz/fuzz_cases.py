"""Generated calls of every public constructor, method and raw op, each with at
most one argument made wrong: another dtype, the meta device, a wrong shape,
a non-contiguous or empty tensor, reserved keys, NaN or infinity, a bad enum
value, a number of the wrong kind or out of range.

Every case must end in one of two ways:
  * an error (TypeError, ValueError, RuntimeError) whose message names the
    argument that was made wrong, with the table (or module) exactly as it
    was; or
  * a result equal to an independent model: the pure-Python table
    (tests/table/table_model.py), plain torch arithmetic, the float64
    optimizer rules, the documented routing hash.
An input the model refuses must not be accepted. A crash of the process is
caught by the caller: this file runs as a script in a child process (see
test_fuzz.py) and writes the case it is about to run to a progress file.

    PYTHONPATH=. python tests/fuzz/fuzz_cases.py --examples 1.0 --progress progress.txt

prints one JSON line: the number of cases run per target.
"""

import argparse
import copy
import json
import math
import os
import random
import re
import sys
import time
import traceback

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbTableOptions,
)
from dynamicemb import DynamicEmbInitializerMode as Mode
from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb import DynamicEmbScoreStrategy as Score
from dynamicemb.table import ScoredHashTable, constants
from tests.table import table_model as M

OPS = torch.ops.dynamicemb
DEVICE = torch.device(os.environ.get("DEMB_FUZZ_DEVICE", "cpu"))
ERRORS = (TypeError, ValueError, RuntimeError)
STATE = ("keys", "digests", "scores", "counters", "free_rows", "info")
KEY_POOL = list(range(1, 90)) + [-1, -5, M.FIRST_VALID_KEY, 2**63 - 1, 2**40 + 7]
RESERVED = [M.EMPTY_KEY, M.EMPTY_KEY + 1, M.EMPTY_KEY + 2, M.EMPTY_KEY + 3]


class Refused(Exception):
    """The contract refuses the call (the model's verdict)."""


# ------------------------------------------------------------ bookkeeping --

COUNTS: dict[str, int] = {}
_progress = None


def _note(target: str, desc: str) -> None:
    COUNTS[target] = COUNTS.get(target, 0) + 1
    if _progress is not None:
        _progress.seek(0)
        _progress.write(f"{target} #{COUNTS[target]}: {desc}\n")
        _progress.truncate()
        _progress.flush()


def _names_match(names, msg: str) -> bool:
    return any(re.search(n, msg) for n in names)


def _equal(got, want, where="result"):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got)}"
        got = got.cpu()
        if want.is_floating_point():
            torch.testing.assert_close(
                got.double(), want.double(), rtol=1e-4, atol=1e-4, equal_nan=True, msg=where
            )
        else:
            assert got.tolist() == want.tolist(), f"{where}: {got.tolist()} != {want.tolist()}"
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _equal(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _snapshot(obj):
    if obj is None:
        return None
    if isinstance(obj, ScoredHashTable):
        return [getattr(obj, k).detach().clone().cpu() for k in STATE] + [obj.num_slots]
    if isinstance(obj, list):
        return [_snapshot(o) for o in obj]
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone().cpu() if obj.device.type != "meta" else None
    return copy.deepcopy(obj)


def _same(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def case(target, desc, call, model, state, names, check=None):
    """Runs one case: `call` is the code under test, `model` the expected
    result (raises Refused where the contract refuses), `state` what must not
    change on refusal, `names` regexes of which one the error must match."""
    _note(target, desc)
    before = _snapshot(state)
    try:
        got = call()
    except ERRORS as e:
        msg = str(e)
        assert _same(before, _snapshot(state)), (
            f"{target}: a refused call changed the state: {msg}\n  {desc}"
        )
        if names:
            assert _names_match(names, msg), (
                f"{target}: the error does not name the argument ({names}): "
                f"{type(e).__name__}: {msg}\n  {desc}"
            )
            return
        try:  # no argument was made wrong: refusing is right only where the model refuses
            model()
        except Refused:
            return
        raise AssertionError(
            f"{target}: a valid call was refused: {type(e).__name__}: {msg}\n  {desc}"
        ) from None
    try:
        want = model()
    except Refused as r:
        raise AssertionError(
            f"{target}: accepted what the contract refuses ({r})\n  {desc}"
        ) from None
    (check or _equal)(got, want)


# ------------------------------------------------------------ mutations --


def _noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous tensor (every other element of a
    buffer twice as long)."""
    if t.dim() == 0 or t.numel() < 2:
        return t
    big = torch.stack([t, t], dim=-1)
    return big[..., 0]


def _append(v: torch.Tensor, x) -> torch.Tensor:
    """`v` with one more entry (row) along dim 0 holding `x`."""
    if v.dim() == 0:
        return torch.stack([v, torch.tensor(x, dtype=v.dtype, device=v.device)])
    return torch.cat([v, v.new_full((1,) + tuple(v.shape[1:]), x)])


@st.composite
def mutation(draw, kind):
    """A mutation of an argument of `kind`: (name, function value -> value)."""
    tensor_common = [
        ("meta", lambda v: v.to("meta")),
        ("noncontiguous", _noncontig),
        ("unsqueezed", lambda v: v.unsqueeze(0)),
        ("empty", lambda v: v[:0]),
        ("shortened", lambda v: v[:-1] if v.dim() and v.shape[0] else v),
        ("list", lambda v: v.tolist()),
        ("none", lambda v: None),
    ]
    by_kind = {
        "keys": tensor_common
        + [
            ("int32", lambda v: v.int()),
            ("float64", lambda v: v.double()),
            ("reserved", lambda v: _append(v, draw(st.sampled_from(RESERVED)))),
        ],
        "index": tensor_common
        + [
            ("int32", lambda v: v.int()),
            ("float32", lambda v: v.float()),
            ("bool", lambda v: v.bool()),
            ("negative", lambda v: _append(v, -2)),
            ("huge", lambda v: _append(v, 2**40)),
        ],
        "float": tensor_common
        + [
            ("float64", lambda v: v.double()),
            ("int64", lambda v: v.long()),
            ("nan", lambda v: _append(v, float("nan"))),
            ("inf", lambda v: _append(v, float("inf"))),
        ],
        "state": [
            ("meta", lambda v: v.to("meta")),
            ("noncontiguous", _noncontig),
            ("shortened", lambda v: v[:-1] if v.shape[0] > 1 else v[:0]),
            ("float64", lambda v: v.double()),
            ("int32", lambda v: v.int()),
            ("none", lambda v: None),
        ],
        "int": [
            ("float", lambda v: float(v or 16) + 0.5),
            ("negative", lambda v: -1 - abs(v or 0)),
            ("huge", lambda v: 2**62),
            ("string", lambda v: str(v)),
            ("none", lambda v: None),
        ],
        "real": [
            ("nan", lambda v: float("nan")),
            ("inf", lambda v: float("inf")),
            ("-inf", lambda v: float("-inf")),
            ("string", lambda v: "fast"),
        ],
        # A field of the ops' `optim` list (a float[]: numbers only).
        "optim_int": [
            ("float", lambda v: float(v or 16) + 0.5),
            ("negative", lambda v: -1 - abs(v or 0)),
            ("huge", lambda v: 2**62),
        ],
        "optim_real": [
            ("nan", lambda v: float("nan")),
            ("inf", lambda v: float("inf")),
            ("-inf", lambda v: float("-inf")),
        ],
        "bool": [("int", lambda v: int(v)), ("none", lambda v: None), ("string", lambda v: "yes")],
        "policies": [
            ("bad_enum", lambda v: [draw(st.sampled_from([-1, 4, 99]))] + list(v[1:])),
            ("float", lambda v: [0.5] + list(v[1:])),
            ("too_many", lambda v: list(v) + [0]),
            ("empty", lambda v: []),
            ("none", lambda v: None),
        ],
    }
    return draw(st.sampled_from(by_kind[kind]))


def mutate(draw, args: dict, kinds: dict, aliases: dict, valid_share=0.2):
    """Mutates at most one argument. Returns (args, description, regexes the
    error must match, mutation name or None)."""
    if not kinds or draw(st.floats(0, 1)) < valid_share:
        return args, "valid", [], None
    name = draw(st.sampled_from(sorted(kinds)))
    how, fn = draw(mutation(kinds[name]))
    args = dict(args)
    args[name] = fn(args[name])
    words = aliases.get(name, [rf"\b{name}\b"])
    return args, f"{name}: {how}", words + [rf"'{name}'"], how


def _vals(t):
    return t.tolist() if isinstance(t, torch.Tensor) else t


def _need_tensor(v, name, dtype, dim=None, contiguous=False):
    """The model's reading of a tensor argument: refuses what the contract does."""
    if not isinstance(v, torch.Tensor):
        raise Refused(f"{name} is not a tensor")
    if v.device.type == "meta":
        raise Refused(f"{name} is on meta")
    if dtype is not None and v.dtype != dtype:
        raise Refused(f"{name} is {v.dtype}")
    if dim is not None and v.dim() != dim:
        raise Refused(f"{name} has {v.dim()} dims")
    if contiguous and not v.is_contiguous():
        raise Refused(f"{name} is not contiguous")
    return v


def _need_int(v, name):
    if isinstance(v, bool) or not isinstance(v, int):
        raise Refused(f"{name} is not an int")
    return v


# The optimizer fields of optimizer_step and embedding_update, by their names
# here and in OptimField: the ops take them as one list (`optim`).
OPTIM_FIELDS = {
    "type": "TYPE",
    "lr": "LEARNING_RATE",
    "eps": "EPS",
    "beta1": "BETA1",
    "beta2": "BETA2",
    "weight_decay": "WEIGHT_DECAY",
    "wd_mode": "WEIGHT_DECAY_MODE",
    "step": "STEP",
    "lr_power": "LEARNING_RATE_POWER",
    "ftrl_beta": "FTRL_BETA",
    "l1": "L1_REG",
    "l2": "L2_REG",
}


def _optim_op_args(a: dict) -> list:
    """optimizer_step's or embedding_update's positional arguments: `a` in
    order, its optimizer fields packed last into one list at their OptimField
    positions."""
    pos = constants()["OptimField"]
    optim = [0.0] * len(pos)
    for k, field in OPTIM_FIELDS.items():
        optim[pos[field]] = float(a[k])
    return [v for k, v in a.items() if k not in OPTIM_FIELDS] + [optim]


def _need_optim_int(v, name):
    """An integer field of the optim list: exactly an integer as a float64."""
    if not float(v).is_integer() or abs(v) >= 2**53:
        raise Refused(f"{name} is not an integer")
    return int(v)


# ------------------------------------------------------------- table setup --

CONFIGS = [
    dict(capacities=[64], bucket_capacities=16, num_scores=1),
    dict(capacities=[32, 64], bucket_capacities=16, num_scores=2, max_capacities=[64, 128]),
    dict(capacities=[32, 48], bucket_capacities=[None, 16], num_scores=1),
    dict(
        capacities=[32, 64],
        bucket_capacities=16,
        num_scores=1,
        no_eviction=[False, True],
        row_capacities=[None, 24],
    ),
]


@st.composite
def filled_table(draw):
    """A small table and its model, holding a few keys (full buckets often)."""
    cfg = draw(st.sampled_from(CONFIGS))
    t = ScoredHashTable(device=DEVICE, **cfg)
    m = M.TableModel(**cfg)
    # Bulk contents from a seeded generator: drawing every element through
    # hypothesis would cost more than the case itself.
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, 60))
    keys = [rnd.choice(KEY_POOL) for _ in range(n)]
    tids = [rnd.randrange(m.num_tables) for _ in range(n)]
    vals = [[rnd.randrange(10) for _ in range(m.num_scores)] for _ in range(n)]
    pol = [M.ASSIGN] * m.num_scores
    if n:
        t.insert_and_evict(
            torch.tensor(keys, device=DEVICE),
            torch.tensor(tids, device=DEVICE),
            policies=pol,
            scores=torch.tensor(vals, device=DEVICE),
        )
        m.insert_and_evict(keys, tids, pol, vals)
    return t, m, cfg


def _batch(draw, m, max_size=24):
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, max_size))
    keys = torch.tensor([rnd.choice(KEY_POOL) for _ in range(n)], dtype=torch.int64)
    tids = torch.tensor([rnd.randrange(m.num_tables) for _ in range(n)], dtype=torch.int64)
    return keys.to(DEVICE), tids.to(DEVICE)


def _model_batch(m, keys, tids):
    """The model's reading of a (keys, table_ids) batch of the table API."""
    _need_tensor(keys, "keys", torch.int64, 1)
    if tids is None and m.num_tables == 1:  # one table: table_ids may be left out
        tids = torch.zeros_like(keys)
    _need_tensor(tids, "table_ids", torch.int64, 1)
    if keys.numel() != tids.numel():
        raise Refused("lengths differ")
    k, t = keys.tolist(), tids.tolist()
    for key, tid in zip(k, t):
        if key < M.FIRST_VALID_KEY:
            raise Refused("reserved key")
        if not 0 <= tid < m.num_tables:
            raise Refused("table id")
    return k, t


def _model_scores(m, n, policies, scores):
    if policies is None:
        policies = [M.ASSIGN if scores is not None else M.NONE] * m.num_scores
    if not isinstance(policies, list) or len(policies) != m.num_scores:
        raise Refused("policies")
    for p in policies:
        if (
            isinstance(p, bool)
            or not isinstance(p, int)
            or p not in (M.NONE, M.ASSIGN, M.ACCUMULATE)
        ):
            raise Refused("policy")
    if scores is None:
        return policies, [[0] * m.num_scores]
    if isinstance(scores, torch.Tensor):
        _need_tensor(scores, "scores", torch.int64)
        v = scores.reshape(-1, m.num_scores) if scores.dim() < 2 else scores
        if v.dim() != 2 or v.shape[1] != m.num_scores or v.shape[0] not in (1, n):
            raise Refused("score rows")
        return policies, v.tolist()
    raise Refused("scores")


def _export_args(draw, m) -> dict:
    """Valid export_batch / table_export arguments (slot range, column, threshold)."""
    lo = draw(st.integers(0, m.num_slots))
    return dict(
        slot_begin=lo,
        slot_end=draw(st.integers(lo, m.num_slots)),
        score_column=draw(st.integers(0, m.num_scores - 1)),
        threshold=draw(st.sampled_from([M.INT64_MIN, 0, 4])),
    )


def _model_export(m, a) -> list:
    """The model's export of the arguments `a` (slot_end None: every slot)."""
    if a["slot_end"] is None:
        a = dict(a, slot_end=m.num_slots)
    for nm in ("slot_begin", "slot_end", "score_column", "threshold"):
        _need_int(a[nm], nm)
    if not 0 <= a["slot_begin"] <= a["slot_end"] <= m.num_slots:
        raise Refused("slot range")
    if not 0 <= a["score_column"] < m.num_scores:
        raise Refused("column")
    if not M.INT64_MIN <= a["threshold"] < 2**63:
        raise Refused("threshold")
    return m.export_batch(a["slot_begin"], a["slot_end"], a["score_column"], a["threshold"])


def _state_of(table, model):
    """The table's whole state must equal the model's."""
    from tests.table.table_testlib import assert_matches_model

    assert_matches_model(table, model)


# ------------------------------------------------------------- targets --

TARGETS = {}


def target(name, quota):
    def wrap(fn):
        TARGETS[name] = (fn, quota)
        return fn

    return wrap


@target("ScoredHashTable()", 1000)
def fuzz_table_constructor(draw):
    n = draw(st.integers(1, 3))
    width = draw(st.sampled_from([16, 32, None]))
    caps = [draw(st.sampled_from([1, 2, 4])) * (width or 16) for _ in range(n)]
    kw = dict(
        capacities=caps,
        bucket_capacities=width,
        num_scores=draw(st.sampled_from([1, 2])),
        no_eviction=draw(st.booleans()),
        max_capacities=[c * draw(st.sampled_from([1, 2])) for c in caps],
        row_capacities=draw(st.sampled_from([None, 8, 100])),
        max_load_factor=draw(st.sampled_from([0.5, 1.0, 0.25])),
        validate=draw(st.booleans()),
    )
    kinds = dict(
        bucket_capacities="int",
        num_scores="int",
        no_eviction="bool",
        row_capacities="int",
        max_load_factor="real",
        validate="bool",
    )
    kw2, desc, names, how = mutate(
        draw,
        kw,
        kinds,
        {"row_capacities": [r"row_capacit"], "bucket_capacities": [r"bucket.capacit"]},
    )
    extra = draw(st.sampled_from(["", "capacities", "max_capacities"]))
    if how is None and extra:
        # Lists: an entry of the wrong kind, or a max capacity off the layout.
        v = list(kw2[extra])
        v[0] = draw(st.sampled_from([v[0] + 0.5, v[0] + 8, -16, 0]))
        kw2[extra] = v
        desc, names = f"{extra}[0] = {v[0]}", [rf"{extra[:-1]}", r"capacit"]

    def call():
        t = ScoredHashTable(device=DEVICE, **kw2)
        keys = torch.arange(1, 30, device=DEVICE)
        tids = keys % len(kw2["capacities"])
        t.insert(keys, tids)
        return t

    def model():
        c = kw2["capacities"]
        for v in c + list(kw2["max_capacities"]):
            _need_int(v, "capacity")
        w = kw2["bucket_capacities"]
        if w is not None:
            _need_int(w, "bucket")
        for k in ("num_scores",):
            _need_int(kw2[k], k)
        if kw2["num_scores"] not in (1, 2):
            raise Refused("num_scores")
        for k in ("no_eviction", "validate"):
            if not isinstance(kw2[k], bool):
                raise Refused(k)
        r = kw2["row_capacities"]
        if r is not None and (_need_int(r, "rows") < 0):
            raise Refused("rows")
        lf = kw2["max_load_factor"]
        if not isinstance(lf, float) or not 0 < lf <= 1:
            raise Refused("load factor")
        for cap, mx in zip(c, kw2["max_capacities"]):
            unit = w or 16
            if cap <= 0 or cap % unit or (w is None and cap % 16) or mx < cap or mx % unit:
                raise Refused("layout")
        m = M.TableModel(c, w, kw2["num_scores"], kw2["no_eviction"], kw2["max_capacities"], r, lf)
        keys = list(range(1, 30))
        m.insert(keys, [k % len(c) for k in keys])
        return m

    case("ScoredHashTable()", desc, call, model, None, names, check=_state_of)


METHOD_ALIASES = {
    "keys": [r"\bkeys?\b"],
    "table_ids": [r"table_ids", r"table id"],
    "scores": [r"\bscores?\b", r"score values"],
    "policies": [r"polic"],
    "values": [r"\bvalues\b"],
    "victim_scores": [r"victim_scores"],
    "incoming": [r"incoming"],
    "capacities": [r"capacit"],
    "slot_begin": [r"slot_begin", r"slot range"],
    "slot_end": [r"slot_end", r"slot range"],
    "score_column": [r"score_column", r"score column"],
    "threshold": [r"threshold"],
    "slots": [r"\bslots?\b"],
    "update": [r"\bupdate\b"],
    "assign_rows": [r"assign_rows"],
    "record": [r"\brecord\b"],
}


@target("ScoredHashTable methods", 3000)
def fuzz_table_methods(draw):
    t, m, cfg = draw(filled_table())
    method = draw(
        st.sampled_from(
            [
                "find",
                "find_gather",
                "insert",
                "insert_and_evict",
                "erase",
                "export_batch",
                "home_starts",
                "reserve",
                "relayout",
                "rows",
                "counter",
            ]
        )
    )
    keys, tids = _batch(draw, m)
    n = keys.numel()
    pol = [draw(st.sampled_from([M.NONE, M.ASSIGN, M.ACCUMULATE])) for _ in range(m.num_scores)]
    per_key = draw(st.booleans())
    svals = torch.randint(-3, 10, (n if per_key and n else 1, m.num_scores), dtype=torch.int64)
    svals = svals.to(DEVICE)
    args, kinds = {}, {}
    if method in ("find", "find_gather", "insert", "insert_and_evict", "erase", "home_starts"):
        args.update(keys=keys, table_ids=tids)
        kinds.update(keys="keys", table_ids="index")
    if method in ("find", "find_gather", "insert", "insert_and_evict"):
        if method.startswith("find") and M.ASSIGN in pol:
            svals = svals[:1]  # repeated keys under a per-key ASSIGN have no defined winner
        args.update(policies=pol, scores=svals)
        kinds.update(policies="policies", scores="index")
    if method.startswith("find"):
        args["update"] = draw(st.booleans())
        kinds["update"] = "bool"
    if method == "find_gather":
        args["values"] = torch.randn(m.num_slots + sum(m.row_caps), 3, device=DEVICE)
        kinds["values"] = "float"
    if method == "insert_and_evict" and draw(st.booleans()):
        args["victim_scores"] = torch.randn(m.num_slots, dtype=torch.float64, device=DEVICE)
        kinds["victim_scores"] = "float"
    if method == "erase":
        args["record"] = draw(st.booleans())
        kinds["record"] = "bool"
    if method == "export_batch":
        args.update(_export_args(draw, m))
        kinds.update(slot_begin="int", slot_end="int", score_column="int", threshold="int")
    if method == "reserve":
        args["incoming"] = [draw(st.integers(0, 40)) for _ in range(m.num_tables)]
        kinds["incoming"] = "policies"
    if method == "relayout":
        args["capacities"] = [c * draw(st.sampled_from([1, 2])) for c in m.caps]
        kinds["capacities"] = "policies"
    if method == "rows":
        args["slots"] = torch.tensor(
            draw(st.lists(st.integers(-1, m.num_slots - 1), max_size=8)), dtype=torch.int64
        ).to(DEVICE)
        kinds["slots"] = "index"
    if method == "counter":
        args["name"] = draw(st.sampled_from(["SIZE", "EVICTIONS", "INSERTS", "size", "FOO"]))
    args2, desc, names, _ = mutate(draw, args, kinds, METHOD_ALIASES)
    if method == "counter" and args2["name"] not in ("SIZE", "EVICTIONS", "INSERTS"):
        names = [r"counter"]
    desc = f"{method}({desc}) on {cfg}"

    def call():
        return getattr(t, method)(**args2)

    def model():
        a = args2
        if method in ("find", "find_gather", "insert", "insert_and_evict", "erase", "home_starts"):
            k, ti = _model_batch(m, a["keys"], a["table_ids"])
        if method in ("find", "find_gather", "insert", "insert_and_evict"):
            p, v = _model_scores(m, len(k), a["policies"], a["scores"])
        for flag in ("update", "record"):
            if flag in a and not isinstance(a[flag], bool):
                raise Refused(flag)
        if method == "find":
            return [m.find(k, ti, p, v, a["update"])]
        if method == "find_gather":
            vals = _need_tensor(a["values"], "values", None, 2)
            if vals.device != t.keys.device:
                raise Refused("values device")
            slots = m.find(k, ti, p, v, a["update"])
            rows = []
            for s, tid in zip(slots, ti):
                r = s
                if s >= 0 and m.no_eviction[tid]:
                    r = sum(m.row_caps[:tid]) + m.scores[s][0]
                rows.append(vals[r].cpu() if r >= 0 else torch.zeros(vals.shape[1]))
            out = torch.stack(rows) if rows else torch.zeros(0, vals.shape[1])
            return [slots, out.to(vals.dtype)]
        if method in ("insert", "insert_and_evict"):
            if a.get("victim_scores") is not None:
                vs = _need_tensor(a["victim_scores"], "victim_scores", torch.float64)
                if vs.shape != (m.num_slots,):
                    raise Refused("victim_scores shape")
                return None  # the model has no victim scores: the state is compared only
            res = m.run(M.OP_INSERT if method == "insert" else M.OP_INSERT_EVICT, k, ti, p, v)
            return [res.slots, res.status]
        if method == "erase":
            return [m.erase(k, ti)]
        if method == "home_starts":
            return [[m.home(tid, key)[0] for key, tid in zip(k, ti)]]
        if method == "export_batch":
            return [_model_export(m, a)]
        if method == "reserve":
            inc = a["incoming"]
            if not isinstance(inc, list) or len(inc) != m.num_tables:
                raise Refused("incoming")
            for x in inc:
                if _need_int(x, "incoming") < 0:
                    raise Refused("incoming")
            try:
                m.reserve(inc)
            except RuntimeError as e:
                raise Refused(str(e)) from None
            return None
        if method == "relayout":
            caps = a["capacities"]
            if not isinstance(caps, list) or len(caps) != m.num_tables:
                raise Refused("capacities")
            for c in caps:
                if _need_int(c, "capacity") < 1:
                    raise Refused("capacity")
            try:
                m.relayout(caps)
            except (ValueError, RuntimeError) as e:
                raise Refused(str(e)) from None
            return None
        if method == "rows":
            s = _need_tensor(a["slots"], "slots", torch.int64)
            if s.device != t.keys.device:
                raise Refused("slots device")
            out = []
            for x in s.flatten().tolist():
                if not -1 <= x < m.num_slots:
                    raise Refused("slot range")
                out.append(m.scores[x][0] if x >= 0 else -1)
            return [out]
        if method == "counter":
            if a["name"] not in ("SIZE", "EVICTIONS", "INSERTS"):
                raise Refused("counter name")
            col = {"SIZE": M.SIZE, "EVICTIONS": M.EVICTIONS, "INSERTS": M.INSERTS}[a["name"]]
            return [[c[col] for c in m.counters]]
        raise AssertionError(method)

    def check(got, want):
        if want is not None:
            if method == "find":
                got = [got]
            elif method == "find_gather":
                got = list(got)
            elif method in ("insert", "insert_and_evict"):
                got = [got.slots, got.status]
            elif method == "erase":
                got = [got.tolist()]
            elif method == "home_starts":
                got = [got]
            elif method == "export_batch":
                from tests.table.table_testlib import exported_records

                got = [exported_records(got)]
            elif method == "rows":
                got = [got.flatten()]
            elif method == "counter":
                got = [got]
            _equal(got, want, method)
        if want is not None or method in ("reserve", "relayout"):
            _state_of(t, m)

    case("ScoredHashTable methods", desc, call, model, t, names, check)


RAW_ALIASES = {
    "keys": [r"\bkeys?\b"],
    "table_ids": [r"table_ids", r"table id"],
    "table_keys": [r"table_keys", r"\bslot", r"info"],
    "digests": [r"digests"],
    "scores": [r"\bscores\b", r"num_scores"],
    "info": [r"\binfo\b"],
    "counters": [r"counters"],
    "free_rows": [r"free_rows"],
    "policies": [r"polic"],
    "score_values": [r"score_values", r"\brow \S+ at index"],
    "op": [r"run op", r"\bop\b"],
    "total_buckets": [r"total_buckets"],
    "has_rows": [r"has_rows"],
    "victim_scores": [r"victim_scores"],
    "values": [r"\bvalues\b", r"\brows? "],
    "slot_begin": [r"slot range"],
    "slot_end": [r"slot range"],
    "score_column": [r"score column"],
    "target_slots": [r"target_slots", r"\bslot \S+ of key"],
}


@target("table ops", 2500)
def fuzz_table_ops(draw):
    t, m, cfg = draw(filled_table())
    op = draw(
        st.sampled_from(
            [
                "table_find",
                "table_find_gather",
                "table_run",
                "table_home_starts",
                "table_export",
                "table_count",
            ]
        )
    )
    keys, tids = _batch(draw, m)
    n = keys.numel()
    pol = [draw(st.sampled_from([M.NONE, M.ASSIGN, M.ACCUMULATE])) for _ in range(m.num_scores)]
    rows_n = n if (draw(st.booleans()) and n) else 1
    svals = torch.randint(-3, 10, (rows_n, m.num_scores), dtype=torch.int64, device=DEVICE)
    if op == "table_find_gather" or (op == "table_find" and M.ASSIGN in pol):
        svals = svals[:1]
    args, kinds = {}, {}
    if op in ("table_find", "table_find_gather", "table_run", "table_home_starts"):
        args.update(keys=keys, table_ids=tids)
        kinds.update(keys="keys", table_ids="index")
    args["table_keys"] = t.keys
    kinds["table_keys"] = "state"
    if op in ("table_find", "table_find_gather", "table_run"):
        args.update(digests=t.digests, scores=t.scores)
        kinds.update(digests="state", scores="state")
    if op == "table_export":
        args["scores"] = t.scores
        kinds["scores"] = "state"
    args["info"] = t.info
    kinds["info"] = "state"
    if op == "table_run":
        args.update(counters=t.counters, free_rows=t.free_rows)
        kinds.update(counters="state", free_rows="state")
    if op in ("table_find", "table_find_gather", "table_run"):
        args.update(policies=pol, score_values=svals)
        kinds.update(policies="policies", score_values="index")
    if op in ("table_find", "table_find_gather"):
        args["update"] = draw(st.booleans())
    if op == "table_run":
        args.update(
            op=draw(st.sampled_from([M.OP_INSERT, M.OP_INSERT_EVICT, M.OP_ERASE, M.OP_PLACE])),
            assign_rows=False,
            total_buckets=t.total_buckets,
            has_rows=t.has_rows,
        )
        kinds.update(op="int", total_buckets="int")
        if draw(st.booleans()) and args["op"] == M.OP_INSERT_EVICT:
            args["victim_scores"] = torch.randn(m.num_slots, dtype=torch.float64, device=DEVICE)
            kinds["victim_scores"] = "float"
        if args["op"] == M.OP_PLACE:
            # A slot of each key's home bucket (replay), now and then one outside it.
            rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
            slots = []
            for key, tid in zip(keys.tolist(), tids.tolist()):
                start, w, _ = m.home(tid, key) if key >= M.FIRST_VALID_KEY else (0, 1, 0)
                slots.append(start + (rnd.randrange(w) if rnd.random() > 0.05 else w))
            args["victim_scores"] = None
            args["target_slots"] = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
            kinds["target_slots"] = "index"
    if op == "table_find_gather":
        args["values"] = torch.randn(m.num_slots + sum(m.row_caps), 3, device=DEVICE)
        kinds["values"] = "float"
    if op == "table_export":
        args.update(_export_args(draw, m))
        kinds.update(slot_begin="int", slot_end="int", score_column="int")
    args2, desc, names, how = mutate(draw, args, kinds, RAW_ALIASES, valid_share=0.25)
    desc = f"{op}({desc}) on {cfg}"
    state_args = [
        v
        for k, v in args.items()
        if k in ("table_keys", "digests", "scores", "counters", "free_rows")
    ]

    def call():
        return getattr(OPS, op)(*args2.values())

    def model():
        a = args2
        for k in ("table_keys", "digests", "scores", "info", "counters", "free_rows"):
            if k in a and a[k] is not args[k]:
                # An empty free_rows (no NO_EVICTION table) for another: nothing is written.
                same_empty = (
                    k == "free_rows"
                    and isinstance(a[k], torch.Tensor)
                    and a[k].device == args[k].device
                    and a[k].dtype == args[k].dtype
                    and a[k].shape == args[k].shape == (0,)
                )
                if not same_empty:
                    raise Refused(f"{k} replaced")
        if op in ("table_find", "table_find_gather", "table_run", "table_home_starts"):
            _need_tensor(a["keys"], "keys", torch.int64, 1, contiguous=True)
            _need_tensor(a["table_ids"], "table_ids", torch.int64, 1, contiguous=True)
            k, ti = _model_batch(m, a["keys"], a["table_ids"])
        if "policies" in a:
            p = a["policies"]
            if (
                not isinstance(p, list)
                or len(p) != m.num_scores
                or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 3 for x in p)
            ):
                raise Refused("policies")
            sv = _need_tensor(a["score_values"], "score_values", torch.int64, 2, contiguous=True)
            if sv.shape[1] != m.num_scores or sv.shape[0] not in (1, len(k)):
                raise Refused("score rows")
            v = sv.tolist()
        if op == "table_find":
            return m.find(k, ti, p, v, a["update"])
        if op == "table_find_gather":
            vals = _need_tensor(a["values"], "values", None, 2, contiguous=True)
            slots = m.find(k, ti, p, v, a["update"])
            out = []
            for s, tid in zip(slots, ti):
                r = s if s < 0 or not m.no_eviction[tid] else sum(m.row_caps[:tid]) + m.scores[s][0]
                if r >= vals.shape[0]:
                    raise Refused("row past values")
                out.append(
                    vals[r].cpu() if r >= 0 else torch.zeros(vals.shape[1], dtype=vals.dtype)
                )
            return [
                slots,
                torch.stack(out) if out else torch.zeros(0, vals.shape[1], dtype=vals.dtype),
            ]
        if op == "table_run":
            o = _need_int(a["op"], "op")
            if o not in (0, 1, 2, 3):
                raise Refused("op")
            if a["total_buckets"] != t.total_buckets:
                raise Refused("total_buckets")
            if o == M.OP_PLACE:
                ts = _need_tensor(a["target_slots"], "target_slots", torch.int64, 1, True)
                if ts.numel() != len(k):
                    raise Refused("target_slots")
                ts = ts.tolist()
                for key, tid, slot in zip(k, ti, ts):
                    start, w, _ = m.home(tid, key)
                    if not start <= slot < start + w or m.no_eviction[tid]:
                        raise Refused("slot outside the home bucket, or NO_EVICTION")
                res = m.place(k, ti, ts, p, v)
                return [res.slots, res.status, [r[0] for r in res.evicted]]
            if a.get("victim_scores") is not None:
                vs = _need_tensor(a["victim_scores"], "victim_scores", torch.float64, 1, True)
                if vs.numel() != m.num_slots:
                    raise Refused("victim_scores")
                return None
            res = m.run(o, k, ti, p, v)
            ev = [r[0] for r in res.evicted]
            return [res.slots, res.status, ev]
        if op == "table_home_starts":
            return [m.home(tid, key)[0] for key, tid in zip(k, ti)]
        if op == "table_export":
            if a["slot_end"] is None:  # (the raw op takes no None; torch refuses it by name)
                raise Refused("slot_end")
            return _model_export(m, a)
        if op == "table_count":
            return m.count()
        raise AssertionError(op)

    def check(got, want):
        if want is not None:
            if op == "table_run":
                n_ev = int(got[6][0])
                got = [got[0], got[1].long(), got[2][:n_ev]]
            elif op == "table_export":
                c = int(got[4][0])
                got = [
                    (k, s, tt, tuple(sc))
                    for k, s, tt, sc in zip(
                        got[0][:c].tolist(),
                        got[1][:c].tolist(),
                        got[2][:c].tolist(),
                        got[3][:c].tolist(),
                    )
                ]
            elif op == "table_find_gather":
                got = list(got)
            _equal(got, want, op)
            _state_of(t, m)  # (the model has no victim scores: want is None)

    case("table ops", desc, call, model, state_args, names, check)


def _route_rank(key: int, dist: int, block: int, world: int) -> int:
    """cc/ops/routing.h, written independently: continuous (0), roundrobin (1),
    hash_roundrobin (2, SplitMix64's finalizer)."""
    mask = (1 << 64) - 1
    if dist == 2:
        x = (key + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        x ^= x >> 31
        return (x >> 1) % world
    if dist == 0 and 0 <= key < block * world:
        return key // block
    return key % world


COUNTER_ALIASES = dict(
    RAW_ALIASES, frequencies=[r"frequenc"], release_at=[r"release_at"], keys=[r"\bkeys?\b"]
)


@target("counter op", 600)
def fuzz_counter_op(draw):
    """counter_add (the admission counter's raw op) against the counter model
    (tests/admission/counter_model.py), after a few counts."""
    from dynamicemb import KVCounter
    from dynamicemb.admission import MultiTableKVCounter
    from tests.admission.counter_model import CounterModel

    widths = [draw(st.sampled_from([16, 32])) for _ in range(draw(st.integers(1, 2)))]
    shares = [(w * draw(st.integers(1, 3)), w) for w in widths]
    c = MultiTableKVCounter([KVCounter(cap, bucket_capacity=w) for cap, w in shares], DEVICE)
    m = CounterModel(shares)
    for _ in range(draw(st.integers(0, 2))):  # earlier counts, full buckets often
        keys, tids = _batch(draw, m, max_size=40)
        keep = keys >= M.FIRST_VALID_KEY
        keys, tids = keys[keep], tids[keep]
        freqs = torch.randint(0, 3, keys.shape, dtype=torch.int64, device=DEVICE)
        release = draw(st.sampled_from([2**63 - 1, 3]))
        c.add_and_release(keys, tids, freqs, release)
        m.add_and_release(keys.tolist(), tids.tolist(), freqs.tolist(), release)
    keys, tids = _batch(draw, m)
    t = c.table
    args = dict(
        keys=keys,
        table_ids=tids,
        table_keys=t.keys,
        digests=t.digests,
        scores=t.scores,
        info=t.info,
        counters=t.counters,
        frequencies=torch.randint(0, 4, keys.shape, dtype=torch.int64, device=DEVICE),
        release_at=draw(st.sampled_from([2**63 - 1, 2, 3, 5])),
        total_buckets=t.total_buckets,
    )
    kinds = dict(
        keys="keys",
        table_ids="index",
        table_keys="state",
        digests="state",
        scores="state",
        info="state",
        counters="state",
        frequencies="index",
        release_at="int",
        total_buckets="int",
    )
    args2, desc, names, _ = mutate(draw, args, kinds, COUNTER_ALIASES, valid_share=0.25)
    desc = f"counter_add({desc}) on {shares}"
    state_args = [t.keys, t.digests, t.scores, t.counters]

    def call():
        return OPS.counter_add(*args2.values())

    def model():
        a = args2
        for k in ("table_keys", "digests", "scores", "info", "counters"):
            if a[k] is not args[k]:
                raise Refused(f"{k} replaced")
        _need_tensor(a["keys"], "keys", torch.int64, 1, contiguous=True)
        _need_tensor(a["table_ids"], "table_ids", torch.int64, 1, contiguous=True)
        k, ti = _model_batch(m, a["keys"], a["table_ids"])
        f = _need_tensor(a["frequencies"], "frequencies", torch.int64, 1, contiguous=True)
        if f.numel() != len(k) or bool((f < 0).any()):
            raise Refused("frequencies")
        release = _need_int(a["release_at"], "release_at")
        if a["total_buckets"] != t.total_buckets:
            raise Refused("total_buckets")
        return m.add_and_release(k, ti, f.tolist(), release)

    def check(got, want):
        _equal(got, want, "counter_add")
        assert t.keys.tolist() == m.keys and t.scores.tolist() == m.scores, desc
        for name, col in (("SIZE", 0), ("INSERT_FAILURES", 1), ("EVICTIONS", 2), ("INSERTS", 5)):
            assert t.counter(name).tolist() == [row[col] for row in m.counters], (name, desc)

    case("counter op", desc, call, model, state_args, names, check)


@target("row and routing ops", 1500)
def fuzz_row_ops(draw):
    op = draw(
        st.sampled_from(["gather_rows", "init_rows", "optimizer_step", "route_keys", "table_timer"])
    )
    n = draw(st.integers(0, 12))
    num_rows = draw(st.integers(1, 10))
    args, kinds = {}, {}
    if op == "gather_rows":
        args["values"] = torch.randn(num_rows, draw(st.integers(0, 5)), device=DEVICE)
        args["rows"] = torch.tensor(
            draw(st.lists(st.integers(-1, num_rows - 1), min_size=n, max_size=n)), dtype=torch.int64
        ).to(DEVICE)
        kinds.update(values="float", rows="index")
    elif op == "init_rows":
        mode = draw(st.sampled_from(["CONSTANT", "DEBUG", "UNIFORM", "NORMAL", "TRUNCATED_NORMAL"]))
        args.update(
            keys=torch.tensor(
                draw(st.lists(st.sampled_from(KEY_POOL), min_size=n, max_size=n)), dtype=torch.int64
            ).to(DEVICE),
            table_ids=torch.tensor(
                draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=torch.int64
            ).to(DEVICE),
            dim=draw(st.integers(0, 6)),
            mode=int(constants()["InitMode"][mode]),
            mean=draw(st.sampled_from([0.0, 1.5])),
            std_dev=draw(st.sampled_from([0.0, 0.5])),
            lower=-1.0,
            upper=draw(st.sampled_from([-1.0, 0.5, 2.0])),
            value=draw(st.sampled_from([0.0, 3.25])),
            seed=draw(st.integers(0, 5)),
        )
        kinds.update(
            keys="keys",
            table_ids="index",
            dim="int",
            mode="int",
            mean="real",
            std_dev="real",
            lower="real",
            upper="real",
            value="real",
            seed="int",
        )
    elif op == "optimizer_step":
        name = draw(st.sampled_from(["SGD", "ADAM", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD"]))
        dim = draw(st.integers(1, 4))
        width = (
            dim
            + {"SGD": 0, "ADAM": 2 * dim, "EXACT_ADAGRAD": dim, "EXACT_ROWWISE_ADAGRAD": 4}[name]
        )
        n = min(n, num_rows + 1)  # distinct rows (or -1)
        rows = draw(st.lists(st.integers(-1, num_rows - 1), min_size=n, max_size=n, unique=True))
        args.update(
            values=(torch.rand(num_rows, width) + 0.1).to(DEVICE),
            rows=torch.tensor(rows, dtype=torch.int64).to(DEVICE),
            grads=torch.randn(n, dim).to(DEVICE),
            type=int(constants()["OptimType"][name]),
            lr=draw(st.sampled_from([0.1, 0.0])),
            eps=1e-3,
            beta1=0.9,
            beta2=0.99,
            weight_decay=0.0,
            wd_mode=0,
            step=draw(st.integers(1, 3)),
            lr_power=-0.5,
            ftrl_beta=0.0,
            l1=0.0,
            l2=0.0,
        )
        kinds.update(
            values="float",
            rows="index",
            grads="float",
            type="optim_int",
            lr="optim_real",
            eps="optim_real",
            beta1="optim_real",
            step="optim_int",
            wd_mode="optim_int",
        )
    elif op == "route_keys":
        nf = draw(st.integers(1, 3))
        args.update(
            keys=torch.tensor(
                draw(st.lists(st.sampled_from(KEY_POOL + [-(2**62)]), min_size=n, max_size=n)),
                dtype=torch.int64,
            ).to(DEVICE),
            feature_ids=torch.tensor(
                draw(st.lists(st.integers(0, nf - 1), min_size=n, max_size=n)), dtype=torch.int64
            ).to(DEVICE),
            dist_types=torch.tensor(
                draw(st.lists(st.integers(0, 2), min_size=nf, max_size=nf)), dtype=torch.int64
            ).to(DEVICE),
            blocks=torch.tensor(
                draw(st.lists(st.integers(1, 50), min_size=nf, max_size=nf)), dtype=torch.int64
            ).to(DEVICE),
            world_size=draw(st.integers(1, 5)),
        )
        kinds.update(
            keys="keys", feature_ids="index", dist_types="index", blocks="index", world_size="int"
        )
    else:
        args["like"] = torch.zeros(draw(st.integers(0, 3)), dtype=torch.int64, device=DEVICE)
    aliases = {
        "rows": [r"\brows?\b"],
        "values": [r"\bvalues\b", r"\brow -?\d+ at index \d+ is out of range"],
        "grads": [r"\bgrads?\b", r"gradients"],
        "type": [r"optimizer type"],
        "lr": [r"\blr\b", r"learning_rate"],
        "wd_mode": [r"weight decay mode", r"weight_decay_mode"],
        "mode": [r"initializer mode"],
        "std_dev": [r"std_dev"],
        "lower": [r"lower"],
        "upper": [r"upper"],
        "feature_ids": [r"feature id", r"feature_ids"],
        "dist_types": [r"dist.type", r"dist_types", r"one dist type"],
        "blocks": [r"block"],
        "world_size": [r"world_size"],
        "keys": [r"\bkeys?\b"],
        "table_ids": [r"table_ids"],
        "dim": [r"\bdim\b"],
        "seed": [r"\bseed\b"],
    }
    args2, desc, names, how = mutate(draw, args, kinds, aliases)
    desc = f"{op}({desc})"
    state = [args["values"]] if op == "optimizer_step" else None
    pre_values = _snapshot(args2.get("values"))

    def call():
        if op == "optimizer_step":
            return OPS.optimizer_step(*_optim_op_args(args2))
        return getattr(OPS, op)(*args2.values())

    def model():
        a = args2
        if op == "gather_rows":
            v = _need_tensor(a["values"], "values", None, 2, True)
            r = _need_tensor(a["rows"], "rows", torch.int64, 1, True)
            out = torch.zeros(r.numel(), v.shape[1], dtype=v.dtype)
            for i, x in enumerate(r.tolist()):
                if not -1 <= x < v.shape[0]:
                    raise Refused("row")
                if x >= 0:
                    out[i] = v[x].cpu()
            return out
        if op == "init_rows":
            k = _need_tensor(a["keys"], "keys", torch.int64, 1, True)
            ti = _need_tensor(a["table_ids"], "table_ids", torch.int64, 1, True)
            if k.numel() != ti.numel():
                raise Refused("lengths")
            for nm in ("dim", "mode", "seed"):
                _need_int(a[nm], nm)
            for nm in ("mean", "std_dev", "lower", "upper", "value"):
                if not isinstance(a[nm], float) or not math.isfinite(a[nm]):
                    raise Refused(nm)
            if (
                a["dim"] < 0
                or not 0 <= a["mode"] < 5
                or a["std_dev"] < 0
                or a["lower"] > a["upper"]
            ):
                raise Refused("values")
            return ("init", k.tolist(), ti.tolist(), a)
        if op == "optimizer_step":
            v = _need_tensor(a["values"], "values", torch.float32, 2, True)
            r = _need_tensor(a["rows"], "rows", torch.int64, 1, True)
            g = _need_tensor(a["grads"], "grads", torch.float32, 2, True)
            if g.shape[0] != r.numel():
                raise Refused("grads")
            for nm in ("type", "wd_mode", "step"):
                _need_optim_int(a[nm], nm)
            for nm in ("lr", "eps", "beta1"):
                if not math.isfinite(a[nm]):
                    raise Refused(nm)
            if a["step"] < 1 or a["wd_mode"] not in (0, 1, 2) or a["type"] not in (0, 1, 2, 3):
                raise Refused("values")
            for x in r.tolist():
                if not -1 <= x < v.shape[0]:
                    raise Refused("row")
            if not torch.isfinite(g).all():
                raise Refused("grads not finite")
            name = {v: k for k, v in constants()["OptimType"].items()}[a["type"]]
            dim = g.shape[1]
            state = {"SGD": 0, "ADAM": 2 * dim, "EXACT_ADAGRAD": dim}.get(name, 4)
            if v.shape[1] < dim + state:
                raise Refused("row width")
            return ("optim", pre_values, r.tolist(), g.cpu(), a)
        if op == "route_keys":
            k = _need_tensor(a["keys"], "keys", torch.int64, 1, True)
            f = _need_tensor(a["feature_ids"], "feature_ids", torch.int64, 1, True)
            d = _need_tensor(a["dist_types"], "dist_types", torch.int64, 1, True)
            b = _need_tensor(a["blocks"], "blocks", torch.int64, 1, True)
            w = _need_int(a["world_size"], "world_size")
            if k.numel() != f.numel() or d.numel() != b.numel() or d.numel() < 1 or w < 1:
                raise Refused("shapes")
            dl, bl = d.tolist(), b.tolist()
            if any(x not in (0, 1, 2) for x in dl) or any(
                x <= 0 and y == 0 for x, y in zip(bl, dl)
            ):
                raise Refused("dist")
            out = []
            for key, fid in zip(k.tolist(), f.tolist()):
                if not 0 <= fid < len(dl):
                    raise Refused("feature")
                out.append(_route_rank(key, dl[fid], bl[fid], w))
            return out
        return "timer"

    def check(got, want):
        if isinstance(want, tuple) and want[0] == "init":
            _, k, ti, a = want
            assert got.shape == (len(k), a["dim"]) and got.dtype == torch.float32
            got = got.cpu()
            mode = [nm for nm, v in constants()["InitMode"].items() if v == a["mode"]][0]
            if mode == "CONSTANT":
                assert (got == a["value"]).all()
            elif mode == "DEBUG":
                mod = constants()["DEBUG_MODULUS"]
                want_rows = torch.tensor([[float(x % mod)] * a["dim"] for x in k]).reshape(
                    len(k), a["dim"]
                )
                _equal(got, want_rows)
            elif mode in ("UNIFORM", "TRUNCATED_NORMAL"):
                assert ((got >= a["lower"]) & (got <= a["upper"])).all(), got
            assert torch.isfinite(got).all()
            if k:  # a key's row does not depend on its batch
                one = OPS.init_rows(
                    torch.tensor(k[-1:]),
                    torch.tensor(ti[-1:]),
                    a["dim"],
                    a["mode"],
                    a["mean"],
                    a["std_dev"],
                    a["lower"],
                    a["upper"],
                    a["value"],
                    a["seed"],
                )
                _equal(got[-1:], one)
        elif isinstance(want, tuple) and want[0] == "optim":
            _, before, rows, grads, a = want
            from tests.embedding.optimizer_reference import reference_step

            class Opt:
                pass

            o = Opt()
            name = [nm for nm, v in constants()["OptimType"].items() if v == a["type"]][0]
            o.optimizer = type("E", (), {"name": name})()
            o.learning_rate, o.weight_decay, o.weight_decay_mode = (
                a["lr"],
                a["weight_decay"],
                a["wd_mode"],
            )
            o.eps, o.beta1, o.beta2 = a["eps"], a["beta1"], a["beta2"]
            expect = before.double()
            dim = grads.shape[1]
            for i, r in enumerate(rows):
                if r < 0:
                    continue
                w, s = reference_step(
                    o, expect[r, :dim], expect[r, dim:], grads[i].double(), a["step"]
                )
                expect[r, :dim] = w
                expect[r, dim : dim + s.numel()] = s
            _equal(a["values"], expect, "optimizer_step values")
        elif want == "timer":
            assert (
                got.shape == (1,)
                and got.dtype == torch.int64
                and got.device == args2["like"].device
            )
        else:
            _equal(
                got,
                want if isinstance(want, torch.Tensor) else torch.tensor(want, dtype=torch.int64),
                op,
            )

    case("row and routing ops", desc, call, model, state, names, check)


def _segments(a: dict) -> list[torch.Tensor]:
    """The two segments of a row space as bytes (contiguous tensors of any
    dtype, 4-byte aligned); Refused where the contract refuses them."""
    out = []
    for name in ("seg0", "seg1"):
        t = _need_tensor(a[name], name, None, None, contiguous=True)
        if t.data_ptr() % 4:
            raise Refused(f"{name} unaligned")
        out.append(t.detach().cpu().reshape(-1).view(torch.uint8).clone())
    return out


def _row(segs: list[torch.Tensor], offset: int, nbytes: int) -> torch.Tensor | None:
    """float32 view of the `nbytes` at byte `offset` of a row space (None for
    -1); Refused unless they lie in one segment at a multiple of 4."""
    if offset == -1:
        return None
    if offset % 4:
        raise Refused("offset not a multiple of 4")
    for seg in segs:
        if 0 <= offset and offset + nbytes <= seg.numel():
            return seg[offset : offset + nbytes].view(torch.float32)
        offset -= seg.numel()
    raise Refused("row outside the segments")


def _lookup_model(op: str, a: dict, pre: list[torch.Tensor] | None):
    """embedding_pool / embedding_update (cc/embedding/pooling.h) in float64
    over float32 rows addressed by byte offset (cc/storage/row_space.h),
    from the arguments as given; Refused where the contract refuses them."""
    segs = _segments(a)
    t = {}
    for k in (
        "rows",
        "inverse",
        "bag_offsets",
        "cols",
        "dims",
        "occ_offsets",
        "occ_order",
        "occ_bag",
    ):
        if k in a:
            t[k] = _need_tensor(a[k], k, torch.int64, 1, True).cpu().tolist()
    for k in ("batch", "out_width", "element_type"):
        if k in a:
            _need_int(a[k], k)
    for k in ("step", "type", "wd_mode"):
        if k in a:
            _need_optim_int(a[k], k)
    if a["element_type"] != int(constants()["ElementType"]["FLOAT32"]):
        raise Refused("element_type")  # (the generator writes float32 rows only)
    for k in ("lr", "eps", "beta1", "beta2", "weight_decay", "lr_power", "ftrl_beta", "l1", "l2"):
        if k in a and not math.isfinite(a[k]):
            raise Refused(k)
    batch = a["batch"]
    rows, cols, dims = t["rows"], t["cols"], t["dims"]
    F = len(cols)
    if F == 0 or len(dims) != F or batch < 0:
        raise Refused("layout")
    if op == "embedding_pool":
        width = a["out_width"]
        n = len(t["inverse"])
    else:
        go = _need_tensor(a["grad_out"], "grad_out", torch.float32, 2, True)
        if go.shape[0] != batch:
            raise Refused("grad_out rows")
        width = go.shape[1]
        n = len(t["occ_order"])
        if a["step"] < 1 or a["type"] != 0 or a["wd_mode"] != 0:
            raise Refused("optimizer")
    if width < 0:
        raise Refused("out_width")
    covered = set()
    for c, d in zip(cols, dims):
        if not (0 <= d and c >= 0 and c + d <= width):
            raise Refused("feature does not fit")
        span = set(range(c, c + d))
        if span & covered:
            raise Refused("features overlap")
        covered |= span
    w = None
    if a["weights"] is not None:
        wt = _need_tensor(a["weights"], "weights", torch.float32, 1, True)
        if wt.numel() != n or not torch.isfinite(wt).all():
            raise Refused("weights")
        w = wt.cpu().tolist()
    if op == "embedding_pool":
        off = t["bag_offsets"]
        if (
            len(off) != F * batch + 1
            or off[0] != 0
            or off[-1] != n
            or any(y < x for x, y in zip(off, off[1:]))
        ):
            raise Refused("bag_offsets")
        if any(not 0 <= i < len(rows) for i in t["inverse"]):
            raise Refused("inverse")
        out = torch.zeros(batch, width, dtype=torch.float64)
        for b in range(F * batch):
            f, i = divmod(b, batch)
            for j in range(off[b], off[b + 1]):
                r = _row(segs, rows[t["inverse"][j]], 4 * dims[f])
                if r is not None:
                    out[i, cols[f] : cols[f] + dims[f]] += (1.0 if w is None else w[j]) * r.double()
        return out
    occ, order, obag = t["occ_offsets"], t["occ_order"], t["occ_bag"]
    if len(occ) != len(rows) + 1 or len(obag) != n:
        raise Refused("occurrence shapes")
    if occ[0] != 0 or occ[-1] != n or any(y < x for x, y in zip(occ, occ[1:])):
        raise Refused("occ_offsets")
    if any(not 0 <= j < n for j in order) or any(not 0 <= b < F * batch for b in obag):
        raise Refused("occurrences")
    if len({r for r in rows if r >= 0}) != len([r for r in rows if r >= 0]):
        raise Refused("a row twice")
    if not torch.isfinite(go).all():
        raise Refused("grad_out not finite")
    after = [seg.clone() for seg in pre]  # the segments as they were, then updated
    g = go.cpu().double()
    for u, r in enumerate(rows):
        if occ[u] == occ[u + 1]:
            _row(segs, r, 0)  # (an offset is checked even without occurrences)
            continue
        d = dims[obag[order[occ[u]]] // batch]
        row = _row(after, r, 4 * d)
        if row is None:
            continue
        acc = torch.zeros(d, dtype=torch.float64)
        for i in range(occ[u], occ[u + 1]):
            j = order[i]
            f, bb = divmod(obag[j], batch)
            acc += (1.0 if w is None else w[j]) * g[bb, cols[f] : cols[f] + d]
        row.copy_((row.double() - a["lr"] * acc).float())
    return ("segments", after, [a["seg0"], a["seg1"]])


@target("lookup ops", 1000)
def fuzz_lookup_ops(draw):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    dims = draw(st.sampled_from([(4,), (2, 3), (4, 4, 2)]))
    F, B = len(dims), draw(st.integers(1, 4))
    lengths = torch.randint(0, 3, (F * B,), generator=g)
    n = int(lengths.sum())
    offsets = torch.zeros(F * B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    bag = torch.repeat_interleave(torch.arange(F * B), lengths)
    inverse = torch.arange(n)  # each occurrence a key of its own: feature dims stay consistent
    num_rows = 32
    width = max(dims) + 4
    values = torch.randn(num_rows, width, generator=g)
    # The rows in two segments (a table's device and host rows): the first k,
    # then the others; a row's offset is its byte offset in the space.
    k = draw(st.integers(0, num_rows))
    seg0, seg1 = values[:k].clone(), values[k:].clone()
    weights = torch.rand(n, generator=g) if draw(st.booleans()) else None
    cols = torch.cumsum(torch.tensor((0,) + dims[:-1]), 0)
    f32 = int(constants()["ElementType"]["FLOAT32"])
    op = draw(st.sampled_from(["embedding_pool", "embedding_update"]))
    if op == "embedding_pool":
        rows = torch.randint(-1, num_rows, (max(n, 1),), generator=g)
        offs = torch.where(rows >= 0, rows * width * 4, -1)
        args = dict(
            seg0=seg0,
            seg1=seg1,
            rows=offs,
            inverse=inverse,
            bag_offsets=offsets,
            weights=weights,
            cols=cols,
            dims=torch.tensor(dims),
            batch=B,
            out_width=int(sum(dims)),
            element_type=f32,
        )
        kinds = dict(
            seg0="float",
            seg1="float",
            rows="index",
            inverse="index",
            bag_offsets="index",
            cols="index",
            dims="index",
            batch="int",
            out_width="int",
            element_type="int",
        )
    else:
        rows = torch.randperm(num_rows, generator=g)[:n]  # distinct rows, one per key
        offs = rows * width * 4
        args = dict(
            seg0=seg0,
            seg1=seg1,
            grad_out=torch.randn(B, int(sum(dims)), generator=g),
            rows=offs,
            occ_offsets=torch.arange(n + 1),
            occ_order=torch.arange(n),
            occ_bag=bag,
            weights=weights,
            cols=cols,
            dims=torch.tensor(dims),
            batch=B,
            element_type=f32,
            type=0,
            lr=0.1,
            eps=1e-8,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.0,
            wd_mode=0,
            step=1,
            lr_power=-0.5,
            ftrl_beta=0.0,
            l1=0.0,
            l2=0.0,
        )
        kinds = dict(
            seg0="float",
            seg1="float",
            grad_out="float",
            rows="index",
            occ_offsets="index",
            occ_order="index",
            occ_bag="index",
            cols="index",
            dims="index",
            batch="int",
            element_type="int",
            lr="optim_real",
            step="optim_int",
        )
    if weights is not None:
        kinds["weights"] = "float"
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    segment = [r"\bseg[01]\b", r"\bsegments?\b", r"\brow offset -?\d+ at index"]
    aliases = {
        "rows": [r"\brows?\b"],
        "seg0": segment,
        "seg1": segment,
        "inverse": [r"inverse", r"bag_offsets must run from 0 to"],
        "bag_offsets": [r"bag_offsets", r"\bbags?\b"],
        "weights": [r"weights"],
        "cols": [r"\bcols\b", r"feature \d+ \(columns"],
        "dims": [r"\bdims?\b", r"feature \d+ \(columns"],
        "batch": [r"\bbatch\b", r"\bbags\b", r"\bbag_offsets has"],
        "out_width": [r"out_width", r"outputs of"],
        "element_type": [r"element_type"],
        "grad_out": [r"grad_out"],
        "occ_offsets": [r"occ_offsets"],
        "occ_order": [r"occ_order", r"occurrence"],
        "occ_bag": [r"occ_bag", r"\bbag\b"],
        "lr": [r"\blr\b"],
        "step": [r"\bstep\b"],
    }
    args2, desc, names, how = mutate(draw, args, kinds, aliases)
    desc = f"{op}({desc}) dims={dims} B={B} k={k}"
    state = [args["seg0"], args["seg1"]]
    pre = None
    if all(
        isinstance(args2[x], torch.Tensor) and args2[x].device.type != "meta"
        for x in ("seg0", "seg1")
    ):
        pre = [
            x.detach().cpu().reshape(-1).view(torch.uint8).clone() if x.is_contiguous() else None
            for x in (args2["seg0"], args2["seg1"])
        ]
        if None in pre:
            pre = None

    def call():
        if op == "embedding_update":
            return OPS.embedding_update(*_optim_op_args(args2))
        return getattr(OPS, op)(*args2.values())

    def model():
        return _lookup_model(op, args2, pre)

    def check(got, want):
        if isinstance(want, tuple):
            for seg, exp in zip(want[2], want[1]):
                got_bytes = seg.detach().cpu().reshape(-1).view(torch.uint8)
                _equal(
                    got_bytes.view(torch.float32) if got_bytes.numel() % 4 == 0 else got_bytes,
                    exp.view(torch.float32) if exp.numel() % 4 == 0 else exp,
                    "updated segments",
                )
        else:
            _equal(got, want, "pooled")

    case("lookup ops", desc, call, model, state, names, check)


def _module_options(draw):
    kw = dict(
        dim=draw(st.sampled_from([2, 4])),
        max_capacity=128,
        bucket_capacity=draw(st.sampled_from([16, 2**63 - 1])),
        score_strategy=draw(
            st.sampled_from([Score.TIMESTAMP, Score.LFU, Score.STEP, Score.NO_EVICTION])
        ),
        initializer_args=DynamicEmbInitializerArgs(mode=Mode.DEBUG),
        max_load_factor=1.0,
    )
    kinds = dict(dim="int", max_capacity="int", bucket_capacity="int", max_load_factor="real")
    return kw, kinds


@target("BatchedDynamicEmbeddingTablesV2", 600)
def fuzz_module(draw):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

    kw, kinds = _module_options(draw)
    pooling = draw(st.sampled_from([Pool.SUM, Pool.MEAN, Pool.NONE]))
    nf = draw(st.integers(1, 2))
    mutate_ctor = draw(st.booleans())
    names, how = [], None
    if mutate_ctor:
        kw, desc, names, how = mutate(
            draw,
            kw,
            kinds,
            {
                "bucket_capacity": [r"bucket.capacit"],
                "max_capacity": [r"max_capacity", r"capacit"],
                "dim": [r"\bdim\b", r"\bdim \["],
                "max_load_factor": [r"max_load_factor"],
            },
        )
    else:
        desc = "valid options"

    def build():
        opts = [DynamicEmbTableOptions(**kw) for _ in range(nf)]
        return BatchedDynamicEmbeddingTablesV2(
            opts, pooling_mode=pooling, optimizer=EmbOptimType.EXACT_SGD, device=DEVICE
        )

    if how is not None:

        def model():
            o = kw
            if not isinstance(o["dim"], int) or isinstance(o["dim"], bool) or o["dim"] <= 0:
                raise Refused("dim")
            if not isinstance(o["max_capacity"], int) or o["max_capacity"] <= 0:
                raise Refused("max_capacity")
            b = o["bucket_capacity"]
            if (
                not isinstance(b, int)
                or b <= 0
                or (b != 2**63 - 1 and b % 16)
                or (b != 2**63 - 1 and o["max_capacity"] % b)
            ):
                raise Refused("bucket_capacity")
            lf = o["max_load_factor"]
            if not isinstance(lf, float) or not 0 < lf <= 1:
                raise Refused("lf")
            return None

        case(
            "BatchedDynamicEmbeddingTablesV2",
            f"ctor: {desc}",
            build,
            model,
            None,
            names,
            check=lambda got, want: None,
        )
        return
    m = build()
    B = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, 3), min_size=nf * B, max_size=nf * B))
    n = sum(lengths)
    keys = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n))
    offsets = [0]
    for x in lengths:
        offsets.append(offsets[-1] + x)
    weights = (
        [draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(n)]
        if pooling == Pool.SUM and draw(st.booleans())
        else None
    )
    args = dict(
        indices=torch.tensor(keys, dtype=torch.int64).to(DEVICE),
        offsets=torch.tensor(offsets).to(DEVICE),
    )
    fk = dict(indices="keys", offsets="index")
    if weights is not None:
        args["pooling_weights"] = torch.tensor(weights).to(DEVICE)
        fk["pooling_weights"] = "float"
    elif kw["score_strategy"] == Score.LFU and pooling == Pool.NONE:
        args["frequency_counters"] = torch.tensor(
            [draw(st.integers(0, 3)) for _ in range(n)], dtype=torch.int64
        ).to(DEVICE)
        fk["frequency_counters"] = "index"
    args2, desc2, names, how = mutate(
        draw, args, fk, {"indices": [r"\bindices\b"], "offsets": [r"\boffsets\b"]}
    )
    desc = f"forward({desc2}) pooling={pooling.name} strategy={kw['score_strategy'].name} F={nf}"

    def state():
        return [
            m.rows.hash_table.keys,
            m.rows.hash_table.scores,
            m.rows.hash_table.counters,
            m.values,
            torch.tensor(m.step),
        ]

    def call():
        return m(**args2)

    def model():
        a = args2
        idx = _need_tensor(a["indices"], "indices", None, 1)
        off = _need_tensor(a["offsets"], "offsets", None, 1)
        for tt in (idx, off):
            if tt.dtype.is_floating_point or tt.dtype == torch.bool:
                raise Refused("dtype")
        il, ol = idx.tolist(), off.tolist()
        if (
            len(ol) < 1
            or (len(ol) - 1) % nf
            or ol[0] != 0
            or ol[-1] != len(il)
            or any(y < x for x, y in zip(ol, ol[1:]))
        ):
            raise Refused("offsets")
        if any(x < M.FIRST_VALID_KEY for x in il):
            raise Refused("reserved")
        w = None
        if a.get("pooling_weights") is not None:
            wt = _need_tensor(a["pooling_weights"], "pooling_weights", torch.float32, 1)
            if wt.numel() != len(il) or not torch.isfinite(wt).all():
                raise Refused("weights")
            w = wt.tolist()
        if a.get("frequency_counters") is not None:
            fc = _need_tensor(a["frequency_counters"], "frequency_counters", None, 1)
            if fc.dtype == torch.bool or fc.numel() != len(il):
                raise Refused("counters")
            fcd = fc.double()
            if not torch.isfinite(fcd).all() or (fcd < 0).any() or (fcd != fcd.round()).any():
                raise Refused("counters")
        mod = constants()["DEBUG_MODULUS"]
        bb = (len(ol) - 1) // nf
        d = kw["dim"]
        if pooling == Pool.NONE:
            return torch.tensor([[float(k % mod)] * d for k in il]).reshape(len(il), d)
        out = torch.zeros(bb, nf * d, dtype=torch.float64)
        for b in range(nf * bb):
            f, i = divmod(b, bb)
            span = range(ol[b], ol[b + 1])
            for j in span:
                wj = 1.0 if w is None else w[j]
                if pooling == Pool.MEAN:
                    wj = 1.0 / len(span)
                out[i, f * d : (f + 1) * d] += wj * float(il[j] % mod)
        return out

    case(
        "BatchedDynamicEmbeddingTablesV2",
        desc,
        call,
        model,
        state,
        names,
        check=lambda got, want: _equal(got.detach(), want, "forward"),
    )


@target("config dataclasses", 1000)
def fuzz_config(draw):
    which = draw(st.sampled_from(["initializer", "options"]))
    if which == "initializer":
        kw = dict(
            mode=draw(st.sampled_from(list(Mode) + ["uniform", "normal"])),
            mean=draw(st.sampled_from([0.0, -1.5, 2])),
            std_dev=draw(st.sampled_from([0.0, 1.0, 3])),
            lower=draw(st.sampled_from([None, -1.0, 0])),
            upper=draw(st.sampled_from([None, 1.0, 5])),
            value=draw(st.sampled_from([0.0, 7.5])),
        )
        kinds = dict(mean="real", std_dev="real", lower="real", upper="real", value="real")
        kw2, desc, names, how = mutate(draw, kw, kinds, {})
        if how is None and draw(st.booleans()):
            kw2["mode"] = draw(st.sampled_from(["nope", 3, None, Score.LFU]))
            desc, names = f"mode={kw2['mode']!r}", [r"\bmode\b"]

        def call():
            return DynamicEmbInitializerArgs(**kw2)

        def model():
            try:
                mode = Mode(kw2["mode"]) if not isinstance(kw2["mode"], Mode) else kw2["mode"]
            except ValueError:
                raise Refused("mode") from None
            for nm in ("mean", "std_dev", "lower", "upper", "value"):
                v = kw2[nm]
                if v is None and nm in ("lower", "upper"):
                    continue
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise Refused(nm)
            if kw2["std_dev"] < 0:
                raise Refused("std")
            lo, hi = kw2["lower"], kw2["upper"]
            if lo is not None and hi is not None and lo > hi:
                raise Refused("bounds")
            return dict(kw2, mode=mode)

        def check(got, want):
            for k, v in want.items():
                assert getattr(got, k) == v, k

        case(
            "config dataclasses",
            f"DynamicEmbInitializerArgs({desc})",
            call,
            model,
            None,
            names + [r"DynamicEmbInitializerArgs"] if how else names,
            check,
        )
        return
    kw = dict(
        dim=draw(st.sampled_from([None, 4, 128])),
        max_capacity=draw(st.sampled_from([None, 64, 1000])),
        init_capacity=draw(st.sampled_from([None, 64])),
        bucket_capacity=draw(st.sampled_from([16, 128, 2**63 - 1])),
        max_load_factor=draw(st.sampled_from([0.5, 1.0])),
        local_hbm_for_values=draw(st.sampled_from([0, 1024])),
        training=draw(st.booleans()),
        score_strategy=draw(st.sampled_from(list(Score))),
    )
    kinds = dict(
        dim="int",
        max_capacity="int",
        init_capacity="int",
        bucket_capacity="int",
        max_load_factor="real",
        local_hbm_for_values="int",
        training="bool",
    )
    kw2, desc, names, how = mutate(draw, kw, kinds, {})

    def call():
        return DynamicEmbTableOptions(**kw2)

    def model():
        for nm in ("dim", "max_capacity", "init_capacity"):
            v = kw2[nm]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise Refused(nm)
        b = kw2["bucket_capacity"]
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0 or (b != 2**63 - 1 and b % 16):
            raise Refused("bucket")
        lf = kw2["max_load_factor"]
        if isinstance(lf, bool) or not isinstance(lf, (int, float)) or not 0 < lf <= 1:
            raise Refused("lf")
        h = kw2["local_hbm_for_values"]
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise Refused("hbm")
        if not isinstance(kw2["training"], bool):
            raise Refused("training")
        return kw2

    def check(got, want):
        for k, v in want.items():
            assert getattr(got, k) == v or (v != v and getattr(got, k) != getattr(got, k)), k

    case(
        "config dataclasses",
        f"DynamicEmbTableOptions({desc})",
        call,
        model,
        None,
        names + [r"DynamicEmbTableOptions"] if how else names,
        check,
    )


# ------------------------------------------------------------------- main --


def _bind(body, fn):
    def test(data):
        body(data, fn)

    return test


def run(targets, scale: float, seed: int | None) -> dict:
    results = {}
    for name in targets:
        fn, quota = TARGETS[name]
        n = max(1, int(quota * scale))
        cfg = settings(
            max_examples=n,
            deadline=None,
            database=None,
            derandomize=seed is None,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )

        def body(data, fn=fn):
            fn(data.draw)

        test = given(data=st.data())(_bind(body, fn))
        if seed is not None:
            from hypothesis import seed as hseed

            test = hseed(seed)(test)
        start = time.perf_counter()
        failure = None
        try:
            cfg(test)()
        except Exception as e:  # a failed case: reported, the other targets still run
            failure = "".join(traceback.format_exception_only(type(e), e))[-4000:]
            for sub in getattr(e, "exceptions", []):
                failure += "\n" + "".join(traceback.format_exception_only(type(sub), sub))[-3000:]
        results[name] = {
            "cases": COUNTS.get(name, 0),
            "seconds": round(time.perf_counter() - start, 1),
        }
        if failure:
            results[name]["failure"] = failure
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=float, default=1.0, help="scale of every target's quota")
    p.add_argument("--progress", help="file the running case is written to (crash reports)")
    p.add_argument("--seed", type=int, help="random instead of the fixed (derandomized) cases")
    p.add_argument("targets", nargs="*", help=f"default: all of {sorted(TARGETS)}")
    a = p.parse_args(argv)
    global _progress
    if a.progress:
        _progress = open(a.progress, "w")
    torch.manual_seed(0)
    res = run(a.targets or list(TARGETS), a.examples, a.seed)
    print(json.dumps(res))
    return 1 if any("failure" in r for r in res.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
