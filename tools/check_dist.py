"""Checks what `python -m build` would ship, without compiling anything.

    python tools/check_dist.py

Builds the sdist (`python -m build --sdist --no-isolation`) from a copy of the
checkout's files (tracked and new, not ignored: no stale build state) and checks
that
  * it carries every file setup.py may compile (cc/sources.bzl: the CPU and the
    CUDA sources and headers of every package), whatever this machine builds;
  * its metadata requires torch >= setup.py's MIN_TORCH and leaves the
    dependencies to the wheel build (Dynamic: Requires-Dist);
then prepares the wheel's metadata from that sdist, as pip does before it
compiles, and checks that the wheel requires exactly this interpreter's torch
release and offers the extras torchrec, numba, numba-cuda, opentelemetry and
prometheus. Exits non-zero and says what is wrong otherwise. tools/test.sh runs it.
"""

import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTRAS = ["torchrec", "numba", "numba-cuda", "opentelemetry", "prometheus"]


def setup_py_names():
    """MIN_TORCH, torch_requirement and read_sources of setup.py, without running setup()."""
    names = {"__name__": "setup_py", "__file__": os.path.join(ROOT, "setup.py")}
    with open(names["__file__"]) as f:
        exec(compile(f.read(), names["__file__"], "exec"), names)
    return names


def copy_checkout(dest):
    """The checkout's tracked and new (not ignored) files, copied to dest."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src) and not os.path.islink(src):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def metadata(text):
    msg = email.parser.Parser().parsestr(text)
    return {k.lower(): msg.get_all(k) for k in set(msg.keys())}


def main():
    import build.util
    import torch

    setup_py = setup_py_names()
    packages = setup_py["read_sources"]()["PACKAGES"]
    wanted = {"setup.py", "pyproject.toml", "cc/sources.bzl"}
    for pkg, files in packages.items():
        for kind in ("hdrs", "cpu_srcs", "cuda_srcs"):
            wanted.update(f"{pkg}/{f}" for f in files[kind])

    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        checkout = os.path.join(tmp, "checkout")
        copy_checkout(checkout)
        made = subprocess.run(
            [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", tmp, checkout],
            capture_output=True,
            text=True,
        )
        if made.returncode:
            print(made.stdout + made.stderr, file=sys.stderr)
            print("check_dist: building the sdist failed", file=sys.stderr)
            return 1
        (name,) = [n for n in os.listdir(tmp) if n.endswith(".tar.gz")]
        with tarfile.open(os.path.join(tmp, name)) as sdist:
            top = name[: -len(".tar.gz")]
            members = {m.name[len(top) + 1 :] for m in sdist.getmembers() if m.isfile()}
            pkg_info = metadata(sdist.extractfile(f"{top}/PKG-INFO").read().decode())
            sdist.extractall(tmp, filter="data")
        missing = sorted(wanted - members)
        if missing:
            errors.append(f"sdist lacks {len(missing)} source files: {missing}")
        want = "torch>=" + setup_py["MIN_TORCH"]
        if want not in (pkg_info.get("requires-dist") or []):
            errors.append(f"sdist requires {pkg_info.get('requires-dist')}, not {want}")
        if "requires-dist" not in [d.lower() for d in pkg_info.get("dynamic") or []]:
            errors.append("sdist does not leave Requires-Dist to the wheel build (Dynamic)")

        wheel = build.util.project_wheel_metadata(os.path.join(tmp, top), isolated=False)
        requires = wheel.get_all("Requires-Dist") or []
        want = "torch==" + torch.__version__.split("+")[0]
        if want not in requires:
            errors.append(f"wheel requires {requires}, not {want}")
        extras = wheel.get_all("Provides-Extra") or []
        if sorted(set(EXTRAS) - set(extras)):
            errors.append(f"wheel extras are {extras}, want {EXTRAS}")

    for e in errors:
        print("check_dist:", e, file=sys.stderr)
    if not errors:
        print(f"check_dist: sdist carries all {len(wanted)} sources; wheel requires {want}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
