"""CUDA graphs of a training step's lookup.

A training step that never waits for the device (docs/architecture.md) is
bound by the host when its batches are large and its kernels many: Python
and the launches take longer to issue a lookup (unique, find-or-insert, new
rows, bag structure: some forty operations and seventy kernels) than the
device takes to run it. The lookup is a function of the batch and of the
tables' state alone (and the admission counter's), and of a padded batch the
shapes are the batch's own, so for a batch shape seen before
``LookupGraphs`` replays it from a CUDA graph: the inputs are copied into the
graph's buffers, the graph is launched once, and its outputs (the batch's bag
structure, ``_Batch``) are the graph's own tensors, rewritten by the next
replay.

What makes a replay equal to the eager lookup, and when none is made:

- The module says whether its step may be captured (``_graph_state``): a
  CUDA module in training, without admission or with an admitter that
  decides for padded batches in one op (the frequency admitter:
  dynamicemb/embedding/admission.py), whose storage's ``train_rows`` neither
  synchronizes nor changes its layout (``graphs.state`` of the storage's
  ``StepGraphs``, dynamicemb/storage/types.py: evicting tables at their
  capacity, no victim scorer, no evicted keys kept), whose failures are not
  read (``safe_check_mode`` IGNORE) and whose unique is not checked on the
  host (``DYNAMICEMB_DEBUG``). It gives the addresses of every state tensor
  the lookup touches, the admission counter's included, and the constants it
  passes (the admission threshold): a graph is replayed only while they are
  unchanged (an expansion, a relayout, a restore or a load rebuilds tensors:
  the graph is captured again).
- A shape is captured the second time it is seen (the first lookup of a
  shape runs eagerly, so the kernels' one-time setup is not captured), at
  most ``MAX_GRAPHS`` shapes are kept (the least recently used is dropped).
- Whatever a lookup reads from the host besides its inputs is data: the
  step's number (the STEP score) is a (1, 1) tensor filled before each
  replay; Adam's bias corrections are made outside the graph.
- What the storage's ``train_rows`` does on the host runs around the graph
  (``graphs.before_lookup``: a cache waits for a prefetch on
  another stream and finishes a batch that had no backward), and what it
  sets there (a cache's slots held by the batch in flight) each replay puts
  back (``graphs.lookup_state``, ``graphs.replayed``).
- A graph's outputs serve one batch at a time: while the batch of its last
  replay is alive and its backward has not run, the lookup runs eagerly
  (two forward passes before one backward each get their own tensors).
- A capture that fails (an operation that cannot be captured) is warned
  about once and the module's lookups run eagerly from then on.

``module.cuda_graphs`` (default: on, unless the environment variable
``DYNAMICEMB_CUDA_GRAPHS`` is ``0``) turns replays off.
"""

import collections
import dataclasses
import gc
import os
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function

# Batch shapes whose graphs a module keeps.
MAX_GRAPHS = 4
# Shapes whose sightings are counted before the oldest are forgotten.
_MAX_SEEN = 64


def graphs_enabled_by_default() -> bool:
    """Whether modules replay their lookups from CUDA graphs unless told
    otherwise (``DYNAMICEMB_CUDA_GRAPHS`` is not ``0``)."""
    return os.environ.get("DYNAMICEMB_CUDA_GRAPHS", "1") != "0"


@dataclass
class _Graph:
    """One captured lookup: the graph, its input buffers (indices, offsets,
    frequency counters or None), the step tensor, the batch its outputs
    form, the state it was captured over, the batch of its last replay."""

    graph: Any
    inputs: tuple
    step: torch.Tensor
    batch: Any
    state: tuple
    storage_state: Any = None
    last: Any = None

    def busy(self) -> bool:
        """The batch of the last replay is alive and not updated yet."""
        b = None if self.last is None else self.last()
        return b is not None and not b.updated


class _ShapeGraphs:
    """CUDA graphs of one of a module's calls, by batch shape: a graph is
    kept while the state it was captured over is unchanged, captured the
    second time its shape is seen, at most ``MAX_GRAPHS`` of them.

    Attributes:
        captures (int): graphs captured so far.
        replays (int): calls served by a replay.
        failed (bool): a capture failed; no more are tried.
    """

    what = "call"

    def __init__(self) -> None:
        self.graphs: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self.seen: collections.Counter = collections.Counter()
        self.captures = 0
        self.replays = 0
        self.failed = False
        self._stream = None

    def _graph(self, key: tuple, state: tuple):
        """The graph of ``key`` captured over ``state``; None when there is
        none (a graph over another state is dropped)."""
        g = self.graphs.get(key)
        if g is not None and g.state != state:
            del self.graphs[key]
            g = None
        return g

    def _due(self, key: tuple) -> bool:
        """Counts a sighting of a shape without a graph: whether to capture it."""
        self.seen[key] += 1
        if self.seen[key] < 2:
            if len(self.seen) > _MAX_SEEN:
                self.seen = collections.Counter({key: 1})
            return False
        return True

    def _record(self, device, fn):
        """``(graph, fn())`` with ``fn``'s work captured in a new CUDA graph
        (nothing runs yet), or None when the capture fails (warned once; no
        more are tried)."""
        graph = torch.cuda.CUDAGraph()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(device))
        # No garbage collection inside the capture: a collected object's CUDA
        # resources (an earlier module's graphs and their memory pool, mapped
        # host memory) would be freed there, and a free that synchronizes the
        # device invalidates the capture.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    out = fn()
                finally:
                    graph.capture_end()
        except Exception as e:  # an operation that cannot be captured
            self.failed = True
            warnings.warn(
                f"dynamicemb: the training {self.what} could not be captured in a CUDA graph "
                f"({e}); it runs eagerly from now on",
                stacklevel=5,
            )
            return None
        finally:
            if collecting:
                gc.enable()
            torch.cuda.current_stream(device).wait_stream(stream)
        return graph, out

    def _keep(self, key: tuple, g) -> None:
        self.graphs[key] = g
        while len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)
        self.captures += 1


class LookupGraphs(_ShapeGraphs):
    """The CUDA graphs of one module's training lookups, by batch shape
    (``_ShapeGraphs``).

    Args:
        state (Callable): the module's graph state (``() -> tuple | None``:
            None when its lookup may not be captured).
        run (Callable): the module's lookup of a batch from the tables' state
            alone (``(indices, offsets, freq, step) -> batch``).
    """

    what = "lookup"

    def __init__(self, state, run) -> None:
        super().__init__()
        self.state, self.run = state, run

    def lookup(self, module, indices, offsets, freq):
        """The batch of a replayed lookup, or None: the module runs it
        eagerly (see the module docstring for when)."""
        if self.failed or torch.cuda.is_current_stream_capturing():
            return None
        if torch.is_inference_mode_enabled():
            return None
        state = self.state()
        if state is None:
            return None
        key = (indices.numel(), offsets.numel(), freq is not None)
        g = self._graph(key, state)
        if g is None:
            if not self._due(key):
                return None
            g = self._capture(module, key, state, indices, offsets, freq)
            if g is None:
                return None
        elif g.busy():
            return None
        with record_function("dynamicemb:lookup_graph"):
            module.storage.graphs.before_lookup()
            for buf, x in zip(g.inputs, (indices, offsets, freq)):
                if buf is not None:
                    buf.copy_(x)
            g.step.fill_(module.step)
            g.graph.replay()
            module.storage.graphs.replayed(g.storage_state)
        self.graphs.move_to_end(key)
        self.replays += 1
        batch = dataclasses.replace(g.batch)
        g.last = weakref.ref(batch)
        return batch

    def _capture(self, module, key, state, indices, offsets, freq) -> _Graph | None:
        """Captures the module's lookup of a batch of this shape (nothing
        runs yet: the caller replays it). None when the capture fails."""
        inputs = tuple(None if x is None else x.clone() for x in (indices, offsets, freq))
        step = torch.zeros((1, 1), dtype=torch.int64, device=indices.device)
        module.storage.graphs.before_lookup()
        got = self._record(indices.device, lambda: self.run(*inputs, step))
        if got is None:
            return None
        graph, batch = got
        g = _Graph(graph, inputs, step, batch, state, module.storage.graphs.lookup_state())
        self._keep(key, g)
        return g


@dataclass
class _PrefetchGraph:
    """One captured prefetch: the graph, its input buffers, its state and
    what the storage's host part does after each replay of it
    (``graphs.prefetch_taken``)."""

    graph: Any
    inputs: tuple
    state: tuple
    taken: Any = None


class PrefetchGraphs(_ShapeGraphs):
    """The CUDA graphs of one module's prefetches (the padded unique of the
    coming batch and the storage's ``graphs.prefetch_rows``), by batch shape,
    over the storage's ``graphs.prefetch_state`` (its tiers' tensors and those
    of the batch in flight, which a replayed lookup keeps at fixed addresses).
    The storage's host part runs around a replay (``graphs.before_prefetch``,
    ``graphs.after_prefetch``)."""

    what = "prefetch"

    def __init__(self, state, run) -> None:
        """``state``: the module's prefetch graph state (``() -> tuple |
        None``); ``run``: its prefetch's kernels (``(indices, offsets)``)."""
        super().__init__()
        self.state, self.run = state, run

    def prefetch(self, module, indices, offsets) -> bool:
        """Whether the prefetch ran from a graph (else the module runs it
        eagerly)."""
        if self.failed or torch.cuda.is_current_stream_capturing():
            return False
        state = self.state()
        if state is None:
            return False
        key = (indices.numel(), offsets.numel())
        g = self._graph(key, state)
        if g is None:
            if not self._due(key):
                return False
            inputs = (indices.clone(), offsets.clone())
            module.storage.graphs.before_prefetch()
            got = self._record(indices.device, lambda: self.run(*inputs))
            if got is None:
                return False
            g = _PrefetchGraph(got[0], inputs, state, module.storage.graphs.prefetch_taken())
            self._keep(key, g)
        with record_function("dynamicemb:prefetch_graph"):
            module.storage.graphs.before_prefetch()
            for buf, x in zip(g.inputs, (indices, offsets)):
                buf.copy_(x)
            g.graph.replay()
            module.storage.graphs.after_prefetch(g.taken)
        self.graphs.move_to_end(key)
        self.replays += 1
        return True
