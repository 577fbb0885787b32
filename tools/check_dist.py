"""Checks what `python -m build` would ship, without compiling anything; a built wheel;
and the wheel installed with its extras into a fresh venv.

    python tools/check_dist.py                       # the sdist and the wheel's metadata
    python tools/check_dist.py --wheel dist/X.whl    # a wheel built on this machine
    python tools/check_dist.py --fresh-venv          # build, install, run the quickstart
    python tools/check_dist.py --fresh-venv --extension .bazel/bin/dynamicemb/_C.so

Builds the sdist (`python -m build --sdist --no-isolation`) from a copy of the
checkout's files (tracked and new, not ignored: no stale build state) and checks
that
  * it carries every file setup.py may compile (cc/sources.bzl: the CPU and the
    CUDA sources and headers of every package), whatever this machine builds, and
    the LICENSE;
  * its metadata has the package's version (dynamicemb.__version__), the license
    (License-Expression: Apache-2.0, License-File: LICENSE), requires torch >=
    setup.py's MIN_TORCH and REQUIRES, offers setup.py's extras with the tested
    ranges, and leaves the dependencies to the wheel build (Dynamic: Requires-Dist);
then prepares the wheel's metadata from that sdist, as pip does before it
compiles, and checks that the wheel has the same version and license, requires
exactly this interpreter's torch release and REQUIRES, and offers each extra of
setup.py with the requirements setup.py gives it for this torch (the torchrec and
FBGEMM releases tested with it). Exits non-zero and says what is wrong otherwise.

With --wheel, checks a wheel built against this interpreter's torch instead: the
same metadata, the LICENSE in its .dist-info, an extension without symbol table
(stripped), and that it imports from the unpacked wheel (with CUDA kernels when
this torch has CUDA). tools/bench/gpu_round.sh's `wheel` part runs it on the GPU
machine.

With --fresh-venv, builds the sdist and from it the wheel (this compiles the
extension: a few minutes), checks the sdist as above and the wheel as --wheel does
(the built wheel's metadata in place of the prepared one), creates a new venv,
installs this torch release and the wheel with the extras of this machine
(torchrec-cpu-deps and opentelemetry on a CPU torch, then torchrec itself with --no-deps,
as docs/building.md says; torchrec-cuda and opentelemetry on a CUDA torch), checks
that `pip check` reports nothing there (on a CPU torch nothing but torchrec's
requirement of the CUDA FBGEMM, CPU_TORCHREC_LINE), and runs
examples/quickstart.py there, outside the checkout. With --extension, the wheel
carries that extension, already built against this torch, instead of one compiled
by setup.py (DEMB_PREBUILT_EXTENSION of setup.py: copied and stripped); everything
else is built and checked as above. tools/test.sh runs --fresh-venv with Bazel's
//dynamicemb:_C.so: it covers the checks without options, and the extension is
compiled once, for the tests and the wheel.
"""

import argparse
import ast
import email.parser
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LICENSE = "Apache-2.0"


def pyproject_classifiers():
    """The classifiers pyproject.toml declares."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["classifiers"]


def setup_py_names():
    """MIN_TORCH, REQUIRES, extras, read_sources ... of setup.py, without running setup()."""
    names = {"__name__": "setup_py", "__file__": os.path.join(ROOT, "setup.py")}
    with open(names["__file__"]) as f:
        exec(compile(f.read(), names["__file__"], "exec"), names)
    return names


def package_version():
    """dynamicemb.__version__, read from the source (the package is not imported)."""
    with open(os.path.join(ROOT, "dynamicemb", "__init__.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "__version__"
        ]:
            return node.value.value
    raise RuntimeError("dynamicemb/__init__.py has no __version__")


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


def canonical(requirement):
    """A requirement string in packaging's canonical form (specifiers sorted), no marker."""
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    req.marker = None
    return str(req)


def extras_declared(requires):
    """{extra: sorted canonical requirements} of Requires-Dist lines with an extra marker."""
    out = {}
    for line in requires:
        marker = line.partition(";")[2]
        for extra in re.findall(r'extra == "([^"]+)"', marker):
            out.setdefault(extra, []).append(canonical(line))
    return {k: sorted(v) for k, v in out.items()}


def common_metadata_errors(meta, what, extras):
    """Version, license and extras of a metadata dict (metadata())."""
    errors = []
    version = package_version()
    if meta.get("version") != [version]:
        errors.append(f"{what} has version {meta.get('version')}, not {version}")
    if meta.get("license-expression") != [LICENSE]:
        errors.append(f"{what} declares license {meta.get('license-expression')}, not {LICENSE}")
    if meta.get("license-file") != ["LICENSE"]:
        errors.append(f"{what} names license files {meta.get('license-file')}, not LICENSE")
    classifiers = pyproject_classifiers()
    if sorted(meta.get("classifier") or []) != sorted(classifiers):
        errors.append(f"{what} has classifiers {meta.get('classifier')}, not {classifiers}")
    declared = extras_declared(meta.get("requires-dist") or [])
    want = {k: sorted(canonical(r) for r in v) for k, v in extras.items()}
    if sorted(meta.get("provides-extra") or []) != sorted(want):
        errors.append(f"{what} offers extras {meta.get('provides-extra')}, want {sorted(want)}")
    for extra, reqs in want.items():
        if declared.get(extra) != reqs:
            errors.append(f"{what}'s extra {extra} requires {declared.get(extra)}, not {reqs}")
    return errors


def wheel_metadata_errors(wheel, torch):
    """What is wrong with a wheel's metadata (version, license, Requires-Dist, extras)."""
    names = setup_py_names()
    errors = []
    requires = wheel.get_all("Requires-Dist") or []
    for want in [pin(torch)] + names["REQUIRES"]:
        if want not in requires:
            errors.append(f"wheel requires {requires}, not {want}")
    meta = {k.lower(): wheel.get_all(k) for k in set(wheel.keys())}
    return errors + common_metadata_errors(meta, "wheel", names["extras"](torch, for_sdist=False))


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
        licenses = os.path.dirname(meta_name) + "/licenses/LICENSE"
        if licenses not in whl.namelist():
            errors.append(f"the wheel lacks {licenses}")
        if "dynamicemb/py.typed" not in whl.namelist():
            errors.append("the wheel lacks dynamicemb/py.typed (PEP 561)")
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


def sdist_errors(sdist):
    """What is wrong with a built sdist: the sources it must carry and its
    metadata (the module docstring's first list)."""
    import torch

    setup_py = setup_py_names()
    packages = setup_py["read_sources"]()["PACKAGES"]
    wanted = {"setup.py", "pyproject.toml", "cc/sources.bzl", "LICENSE"}
    for pkg, files in packages.items():
        for kind in ("hdrs", "cpu_srcs", "cuda_srcs"):
            wanted.update(f"{pkg}/{f}" for f in files[kind])
    errors = []
    name = os.path.basename(sdist)
    with tarfile.open(sdist) as tar:
        top = name[: -len(".tar.gz")]
        members = {m.name[len(top) + 1 :] for m in tar.getmembers() if m.isfile()}
        pkg_info = metadata(tar.extractfile(f"{top}/PKG-INFO").read().decode())
    missing = sorted(wanted - members)
    if missing:
        errors.append(f"sdist lacks {len(missing)} source files: {missing}")
    for want in ["torch>=" + setup_py["MIN_TORCH"]] + setup_py["REQUIRES"]:
        if want not in (pkg_info.get("requires-dist") or []):
            errors.append(f"sdist requires {pkg_info.get('requires-dist')}, not {want}")
    if "requires-dist" not in [d.lower() for d in pkg_info.get("dynamic") or []]:
        errors.append("sdist does not leave Requires-Dist to the wheel build (Dynamic)")
    errors += common_metadata_errors(pkg_info, "sdist", setup_py["extras"](torch, for_sdist=True))
    for e in errors:
        print("check_dist:", e, file=sys.stderr)
    if not errors:
        print(
            f"check_dist: sdist carries all {len(wanted)} sources and the LICENSE; "
            f"{package_version()}, {LICENSE}, requires torch>={setup_py['MIN_TORCH']}"
        )
    return errors


def main():
    import build.util
    import torch

    setup_py = setup_py_names()
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
        errors += sdist_errors(os.path.join(tmp, name))
        with tarfile.open(os.path.join(tmp, name)) as sdist:
            sdist.extractall(tmp, filter="data")
        top = name[: -len(".tar.gz")]
        wheel = build.util.project_wheel_metadata(os.path.join(tmp, top), isolated=False)
        wheel_errors = wheel_metadata_errors(wheel, torch)
        for e in wheel_errors:
            print("check_dist:", e, file=sys.stderr)
        errors += wheel_errors
        extras_of_wheel = sorted(setup_py["extras"](torch, for_sdist=False))
    if not errors:
        requires = ", ".join([pin(torch)] + setup_py["REQUIRES"])
        print(
            f"check_dist: the wheel's metadata: {package_version()}, {LICENSE}, extras "
            f"{', '.join(extras_of_wheel)}; requires {requires}"
        )
    return 1 if errors else 0


def _run(cmd, what, **kwargs):
    """Runs cmd; says how long it took, and on failure prints its output and what failed."""
    start = time.monotonic()
    ran = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    print(f"check_dist: {what}: {time.monotonic() - start:.0f} s", flush=True)
    if ran.returncode:
        print(ran.stdout[-6000:] + ran.stderr[-6000:], file=sys.stderr)
        print(f"check_dist: {what} failed ({' '.join(map(str, cmd))})", file=sys.stderr)
    return ran


# What `pip check` says on a CPU machine after docs/building.md's two steps:
# torchrec's metadata names the CUDA FBGEMM, whose module fbgemm-gpu-cpu provides
# under another distribution name. Nothing else may be reported.
CPU_TORCHREC_LINE = re.compile(r"torchrec \S+ requires fbgemm-gpu, which is not installed\.")


def pip_check_problems(output, cuda):
    """The lines of `pip check`'s output that are problems: every line but, on
    a CPU machine, torchrec's requirement of the CUDA FBGEMM."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines if line != "No broken requirements found."]
    return [line for line in lines if cuda or not CPU_TORCHREC_LINE.fullmatch(line)]


def fresh_venv(extension=None):
    """Builds the wheel (with `extension`, a prebuilt dynamicemb._C, when given),
    installs it with this machine's extras into a new venv and runs
    examples/quickstart.py there (see the module docstring)."""
    import torch

    cuda = bool(torch.version.cuda)
    wanted = ["torchrec-cuda", "opentelemetry"] if cuda else ["torchrec-cpu-deps", "opentelemetry"]
    setup_py = setup_py_names()
    extras = setup_py["extras"](torch, for_sdist=False)
    torchrec = [r for r in extras["torchrec-cuda"] if r.startswith("torchrec")]
    with tempfile.TemporaryDirectory() as tmp:
        checkout, out = os.path.join(tmp, "checkout"), os.path.join(tmp, "dist")
        copy_checkout(checkout)
        start = time.monotonic()
        build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", out, checkout]
        prebuilt = setup_py["PREBUILT"]  # the variable setup.py reads
        env = dict(os.environ)
        env.pop(prebuilt, None)
        if extension is not None:
            env[prebuilt] = os.path.abspath(extension)
        if _run(build, "building the sdist and the wheel", env=env).returncode:
            return 1
        (wheel,) = [os.path.join(out, n) for n in os.listdir(out) if n.endswith(".whl")]
        (sdist,) = [os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tar.gz")]
        made = f"with {extension}" if extension else "compiling the extension"
        print(
            f"check_dist: built {os.path.basename(wheel)} ({made}) "
            f"in {time.monotonic() - start:.0f} s"
        )
        # The sdist the wheel was built from, then the wheel: what the checks
        # without --fresh-venv check, on the built files.
        if sdist_errors(sdist) or check_wheel(wheel):
            return 1
        venv = os.path.join(tmp, "venv")
        if _run([sys.executable, "-m", "venv", venv], "creating a venv").returncode:
            return 1
        # --no-compile: no .pyc files written for every module of torch and the rest
        # (about half of the install's time); what the quickstart imports is
        # compiled when it is imported.
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--no-compile"]
        # torch in the same call, so the resolver keeps this release.
        steps = [pip + [pin(torch), f"{wheel}[{','.join(wanted)}]"]]
        if not cuda:  # torchrec's metadata asks for the CUDA fbgemm-gpu (docs/building.md)
            steps.append(pip + ["--no-deps"] + torchrec)
        for step in steps:
            if _run(step, "installing into the fresh venv").returncode:
                return 1
        checked = subprocess.run([pip[0], "-m", "pip", "check"], capture_output=True, text=True)
        problems = pip_check_problems(checked.stdout + checked.stderr, cuda)
        if problems:
            print(
                "check_dist: pip check in the fresh venv: " + "; ".join(problems), file=sys.stderr
            )
            return 1
        # The script with examples/checkout.py, which it imports (and which leaves
        # an installed dynamicemb alone), in a folder of their own.
        examples = os.path.join(tmp, "examples")
        os.mkdir(examples)
        for name in ("quickstart.py", "checkout.py"):
            shutil.copy(os.path.join(ROOT, "examples", name), examples)
        script = os.path.join(examples, "quickstart.py")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        ran = _run(
            [pip[0], script], "examples/quickstart.py in the fresh venv", cwd=examples, env=env
        )
        if ran.returncode or not ran.stdout.strip().endswith("quickstart: OK"):
            return 1
    print(
        f"check_dist: a fresh venv with {pin(torch)} and the wheel[{','.join(wanted)}]"
        + ("" if cuda else f" (then {' '.join(torchrec)} --no-deps)")
        + f" runs examples/quickstart.py ({time.monotonic() - start:.0f} s in all)"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", help="check this built wheel instead of the sdist")
    parser.add_argument(
        "--fresh-venv",
        action="store_true",
        help="build the wheel, install it with its extras into a new venv, run the quickstart",
    )
    parser.add_argument(
        "--extension",
        help="with --fresh-venv: package this prebuilt dynamicemb._C instead of compiling one",
    )
    args = parser.parse_args()
    if args.extension and not args.fresh_venv:
        parser.error("--extension goes with --fresh-venv")
    if args.fresh_venv:
        sys.exit(fresh_venv(args.extension))
    sys.exit(check_wheel(args.wheel) if args.wheel else main())
