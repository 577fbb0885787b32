"""Faults injected into the file-system operations of a stream's publish,
and the publisher process the fault tests kill.

``Faults`` wraps the calls a publish makes to the file system (``os.mkdir``,
which ``os.makedirs`` calls too, ``os.rename``, ``os.fsync``, the local store's
``open_write`` and every ``write`` of the files it opens) and counts them;
at operation ``at`` it raises ``OSError(ENOSPC)`` (a disk that is full) or,
with ``kill``, SIGKILLs its own process (a publisher that dies there).

``main(FOLDER, WHERE)`` (by hand: ``python -m tests.replication.stream_faults
FOLDER WHERE``) is a publisher of the fault tests' case that publishes
``CLEAN`` deltas, then dies in the next publish: at the middle of its
operations (``WHERE=middle``: files written, no manifest) or at its last
(``WHERE=last``: the delta renamed into place, the publisher never told).
"""

import contextlib
import errno
import os
import signal
import sys

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb.io import fs
from tests.replication import repl_harness as r

CASE = r.case("faults", S.TIMESTAMP, "adam", tables=("t0", "t1"))
CLEAN = 3


class Faults:
    """Counts (and at ``at`` fails or kills) the file-system operations
    made while ``installed``."""

    def __init__(self, at: int | None = None, kill: bool = False) -> None:
        self.at = at
        self.kill = kill
        self.count = 0
        self.seen: list[str] = []

    def hit(self, what: str) -> None:
        i = self.count
        self.count += 1
        self.seen.append(what)
        if i != self.at:
            return
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, f"No space left on device (injected at operation {i}: {what})")

    @contextlib.contextmanager
    def installed(self):
        faults = self

        class File:
            def __init__(self, f) -> None:
                self._f = f

            def write(self, data):
                faults.hit("write")
                return self._f.write(data)

            def __getattr__(self, name):
                return getattr(self._f, name)

        # os.makedirs makes its folders with os.mkdir.
        saved = {n: getattr(os, n) for n in ("mkdir", "rename", "fsync")}
        open_write = fs.Local.open_write

        def wrap(name, fn):
            def wrapped(*args, **kwargs):
                # An mkdir of a folder that exists changes nothing: not counted.
                if name != "mkdir" or not os.path.isdir(args[0]):
                    faults.hit(name)
                return fn(*args, **kwargs)

            return wrapped

        for name, fn in saved.items():
            setattr(os, name, wrap(name, fn))
        fs.Local.open_write = lambda store, path: File(wrap("open_write", open_write)(store, path))
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(os, name, fn)
            fs.Local.open_write = open_write


def train_step(model, step: int, first: int = 0) -> None:
    from tests.checkpoint import ckpt_harness as c

    c.train(model, CASE, 0, steps=1, first=first + step)


def main(folder: str, where: str) -> None:
    """The publisher killed in a publish (see the module docstring)."""
    import dist_launch  # examples/, on the path the test gives

    from dynamicemb.replication import DeltaPublisher
    from tests.checkpoint import ckpt_harness as c

    dist_launch.init_process_group(0, 1, dist_launch.free_port(), "cpu", 1)
    model = c.build(CASE, 1)
    pub = DeltaPublisher(model, folder)
    pub.checkpoint(optim=True)
    probe = Faults()
    for step in range(CLEAN):
        train_step(model, step)
        with probe.installed():
            pub.publish()
    n = probe.count // CLEAN
    train_step(model, CLEAN)
    with Faults(at=n // 2 if where == "middle" else n - 1, kill=True).installed():
        pub.publish()
    raise SystemExit("the publisher was not killed")


if __name__ == "__main__":
    main(*sys.argv[1:])
