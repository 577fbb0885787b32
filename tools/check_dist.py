"""Checks what `python -m build` would ship, without compiling anything; and a built wheel.

    python tools/check_dist.py                       # the sdist and the wheel's metadata
    python tools/check_dist.py --wheel dist/X.whl    # a wheel built on this machine

Builds the sdist (`python -m build --sdist --no-isolation`) from a copy of the
checkout's files (tracked and new, not ignored: no stale build state) and checks
that
  * it carries every file setup.py may compile (cc/sources.bzl: the CPU and the
    CUDA sources and headers of every package), whatever this machine builds;
  * its metadata requires torch >= setup.py's MIN_TORCH and REQUIRES, and leaves the
    dependencies to the wheel build (Dynamic: Requires-Dist);
then prepares the wheel's metadata from that sdist, as pip does before it
compiles, and checks that the wheel requires exactly this interpreter's torch
release and REQUIRES, and offers the extras torchrec, numba, numba-cuda,
opentelemetry and prometheus. Exits non-zero and says what is wrong otherwise.
tools/test.sh runs it.

With --wheel, checks a wheel built against this interpreter's torch instead: the
same metadata, an extension without symbol table (stripped), and that it imports
from the unpacked wheel (with CUDA kernels when this torch has CUDA).
tools/bench/gpu_round.sh's `wheel` part runs it on the GPU machine.
"""

import argparse
import email.parser
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTRAS = ["torchrec", "numba", "numba-cuda", "opentelemetry", "prometheus"]


def setup_py_names():
    """MIN_TORCH, REQUIRES and read_sources of setup.py, without running setup()."""
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


def pin(torch):
    """What a wheel built against this torch requires (setup.py's torch_requirement)."""
    return "torch==" + torch.__version__.split("+")[0]


def wheel_metadata_errors(wheel, torch):
    """What is wrong with a wheel's metadata (Requires-Dist, Provides-Extra)."""
    errors = []
    requires = wheel.get_all("Requires-Dist") or []
    for want in [pin(torch)] + setup_py_names()["REQUIRES"]:
        if want not in requires:
            errors.append(f"wheel requires {requires}, not {want}")
    extras = wheel.get_all("Provides-Extra") or []
    if sorted(set(EXTRAS) - set(extras)):
        errors.append(f"wheel extras are {extras}, want {EXTRAS}")
    return errors


def elf_section_names(path):
    """Section names of an ELF64 little-endian file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]  # sh_offset of the section names
    return {data[strtab + h[0] : data.index(b"\0", strtab + h[0])].decode() for h in headers}


def check_wheel(path):
    import torch

    errors = []
    with zipfile.ZipFile(path) as whl, tempfile.TemporaryDirectory() as tmp:
        (meta_name,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(whl.read(meta_name).decode())
        errors += wheel_metadata_errors(meta, torch)
        whl.extractall(tmp)
        (ext,) = [n for n in whl.namelist() if n.startswith("dynamicemb/_C") and n.endswith(".so")]
        sections = elf_section_names(os.path.join(tmp, ext))
        if ".symtab" in sections or any(s.startswith(".debug") for s in sections):
            errors.append(f"{ext} is not stripped (sections {sorted(sections)})")
        probe = (
            "import torch, dynamicemb.table as t, dynamicemb.storage, dynamicemb.admission\n"
            "from dynamicemb.table._native import extension\n"
            "t.ScoredHashTable([1024])\n"
            "print(extension().__file__, int(extension().cuda_built()))\n"
        )
        env = dict(os.environ, PYTHONPATH=tmp)
        ran = subprocess.run(
            [sys.executable, "-c", probe], cwd=tmp, env=env, capture_output=True, text=True
        )
        if ran.returncode:
            errors.append(f"importing the unpacked wheel failed:\n{ran.stderr}")
        else:
            loaded, cuda_built = ran.stdout.split()[-2:]
            if not os.path.realpath(loaded).startswith(os.path.realpath(tmp)):
                errors.append(f"the extension came from {loaded}, not from the wheel")
            if torch.version.cuda and cuda_built != "1":
                errors.append("the wheel's extension has no CUDA kernels, though torch has CUDA")
        size = whl.getinfo(ext).file_size
    for e in errors:
        print("check_dist:", e, file=sys.stderr)
    if not errors:
        kernels = "CUDA and CPU" if torch.version.cuda else "CPU"
        print(
            f"check_dist: {os.path.basename(path)} requires {pin(torch)}; {ext} stripped "
            f"({size} bytes), imports with its {kernels} kernels"
        )
    return 1 if errors else 0


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
        for want in ["torch>=" + setup_py["MIN_TORCH"]] + setup_py["REQUIRES"]:
            if want not in (pkg_info.get("requires-dist") or []):
                errors.append(f"sdist requires {pkg_info.get('requires-dist')}, not {want}")
        if "requires-dist" not in [d.lower() for d in pkg_info.get("dynamic") or []]:
            errors.append("sdist does not leave Requires-Dist to the wheel build (Dynamic)")

        wheel = build.util.project_wheel_metadata(os.path.join(tmp, top), isolated=False)
        errors += wheel_metadata_errors(wheel, torch)

    for e in errors:
        print("check_dist:", e, file=sys.stderr)
    if not errors:
        print(
            f"check_dist: sdist carries all {len(wanted)} sources; wheel requires "
            + ", ".join([pin(torch)] + setup_py["REQUIRES"])
        )
    return 1 if errors else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", help="check this built wheel instead of the sdist")
    args = parser.parse_args()
    sys.exit(check_wheel(args.wheel) if args.wheel else main())
