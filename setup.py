"""Builds dynamicemb and its extension `dynamicemb._C` without Bazel.

    pip install --no-build-isolation -e .        # or: pip install --no-build-isolation .
    python setup.py build_ext --inplace          # puts dynamicemb/_C*.so in the tree
    python -m build --no-isolation               # sdist and wheel into dist/

The C++/CUDA sources are the ones Bazel compiles, read from cc/sources.bzl.
The CUDA sources (`cuda_srcs` of cc/sources.bzl) are built when torch has
CUDA (torch.version.cuda) and nvcc is found; otherwise a CPU-only extension is built.

Environment:
    DEMB_BUILD_CUDA=0|1   force the CPU-only build, or fail unless CUDA can be built
    DEMB_CUDA_ARCHS       GPU archs, e.g. "90", "8.0 9.0", "sm_90a" (default: CUDA_ARCHS
                          of cc/sources.bzl)
    CUDA_HOME/CUDA_PATH   the CUDA toolkit (default: /usr/local/cuda, or nvcc on PATH)
    MAX_JOBS              parallel compile jobs (ninja)
    DEMB_STRIP=0          keep the extension's symbol table (it is stripped by default)
    DEMB_PREBUILT_EXTENSION=/abs/path/_C.so
                          package this extension, already built against the same torch
                          (e.g. Bazel's //dynamicemb:_C.so), instead of compiling one; it
                          is copied and stripped as DEMB_STRIP says (tools/test.sh's
                          packaging check: the extension compiled once for the tests and
                          the wheel)

A wheel requires the torch release it was built against (the extension is bound
to its C++ ABI), and its extras the torchrec and FBGEMM releases tested with that
torch (TESTED_WITH); an sdist requires torch >= MIN_TORCH, the oldest it builds
with, and the tested range of torchrec and FBGEMM.
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


# torch 2.13's headers need C++20; older torch (2.11 on the GPU machine) is
# built as C++17, and the extension follows it.
# The oldest torch the sources build and run with (an sdist's requirement).
MIN_TORCH = "2.11"

# What the wheel and the sdist require besides torch: dynamicemb.admission reads and
# writes its counter files through numpy (torch does not require it).
REQUIRES = ["numpy"]

# The torchrec and FBGEMM releases tested with each torch release, oldest first
# (docs/building.md, "Versions"). A wheel's extras pin the pair tested with the torch
# it is built against; an sdist's, and a wheel's for a torch release not listed here,
# allow the range from the oldest to the newest pair.
TESTED_WITH = [
    # (torch, torchrec, fbgemm-gpu / fbgemm-gpu-cpu)
    ("2.11", "1.6.1", "1.6.0"),
    ("2.13", "1.8.0", "1.8.0"),
    # The newest set on the index: CI runs part of the suite with it (tools/newest_smoke.sh).
    ("2.14", "1.9.2", "1.9.0"),
]

# torchrec's requirements other than fbgemm-gpu (those of every tested torchrec:
# 1.6.1 also requires iopath). The CPU extra lists them instead of torchrec, whose
# metadata asks for the CUDA build fbgemm-gpu: torchrec is installed after it with
# --no-deps (docs/building.md, "Extras").
TORCHREC_REQUIRES = ["tensordict", "torchmetrics==1.0.3", "tqdm", "pyre-extensions", "iopath"]


def torch_release(torch):
    """'2.13' for torch 2.13.0+cpu."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def tested_specifiers(torch, for_sdist):
    """(torchrec, fbgemm) version specifiers: the tested pair of this torch
    release for a wheel, else the tested range."""
    pairs = {t: (rec, fb) for t, rec, fb in TESTED_WITH}
    pair = None if for_sdist else pairs.get(torch_release(torch))
    if pair is not None:
        return "==" + pair[0], "==" + pair[1]
    (_, rec_lo, fb_lo), (_, rec_hi, fb_hi) = TESTED_WITH[0], TESTED_WITH[-1]
    return f">={rec_lo},<={rec_hi}", f">={fb_lo},<={fb_hi}"


def extras(torch, for_sdist):
    """The extras: what each part of the package imports beyond torch and numpy."""
    torchrec, fbgemm = tested_specifiers(torch, for_sdist)
    return {
        # FBGEMM alone: dynamicemb.embedding's optimizers are FBGEMM's EmbOptimType.
        "fbgemm-cuda": ["fbgemm-gpu" + fbgemm],
        "fbgemm-cpu": ["fbgemm-gpu-cpu" + fbgemm],
        # dynamicemb.planner, .shard, .checkpoint, .replication and .twin. On a CUDA
        # machine torchrec and the CUDA FBGEMM in one go; on a CPU machine FBGEMM's
        # CPU build and torchrec's other requirements, then torchrec with --no-deps.
        "torchrec-cuda": ["torchrec" + torchrec, "fbgemm-gpu" + fbgemm],
        "torchrec-cpu-deps": ["fbgemm-gpu-cpu" + fbgemm] + TORCHREC_REQUIRES,
        # A table's score_function: compiled with numba on the CPU, numba-cuda on a GPU.
        "numba": ["numba"],
        "numba-cuda": ["numba", "numba-cuda"],
        # dynamicemb.metrics: the instruments need the API only; serve_prometheus the
        # SDK and the Prometheus exporter.
        "opentelemetry": ["opentelemetry-api"],
        "prometheus": [
            "opentelemetry-api",
            "opentelemetry-sdk",
            "opentelemetry-exporter-prometheus",
        ],
        # Checkpoint and delta paths that are fsspec URLs (dynamicemb.io.fs): s3://.
        "s3": ["fsspec>=2023.1.0", "s3fs>=2023.1.0"],
        # The tests; the object store tests start moto's S3 server.
        "test": ["pytest", "hypothesis", "numpy", "fsspec", "s3fs", "moto[server]"],
    }


def torch_requirement(torch, for_sdist):
    """torch pinned to the release being built against (local tag such as
    +cu130 dropped: pip matches it for any build of that release), or for an
    sdist, the range it can be built with."""
    if for_sdist:
        return "torch>=" + MIN_TORCH
    return "torch==" + torch.__version__.split("+")[0]


def cxx_std(torch):
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 13) else "-std=c++17"


def read_sources():
    """Evaluates cc/sources.bzl (plain Python literals) and returns its names."""
    path = os.path.join(ROOT, "cc", "sources.bzl")
    names = {}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), names)
    return names


def is_toolkit(path):
    return bool(path) and os.path.isfile(os.path.join(path, "bin", "nvcc.profile"))


def find_cuda_home():
    """The CUDA toolkit root, or None.

    nvcc on PATH may be a wrapper script (e.g. /usr/local/bin/nvcc), so its real path
    is used, and a candidate counts only if bin/nvcc.profile is there.
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
        candidates.append(os.path.dirname(os.path.dirname(nvcc)))
    for c in candidates:
        if is_toolkit(c):
            return os.path.realpath(c)
    return None


def gencode_flags(spec):
    """nvcc -gencode flags for DEMB_CUDA_ARCHS ("80;90", "8.0,9.0", "sm_90a", ...)."""
    flags = []
    for item in re.split(r"[;,\s]+", spec.strip()):
        if not item:
            continue
        ptx = item.endswith("+PTX")
        arch = item[: -len("+PTX")] if ptx else item
        arch = arch.replace("sm_", "").replace("compute_", "").replace(".", "")
        if not re.fullmatch(r"\d+[af]?", arch):
            sys.exit("setup.py: cannot parse CUDA arch %r in DEMB_CUDA_ARCHS=%r" % (item, spec))
        flags.append("-gencode=arch=compute_%s,code=sm_%s" % (arch, arch))
        if ptx:
            flags.append("-gencode=arch=compute_%s,code=compute_%s" % (arch, arch))
    return flags


def build_cuda_wanted(torch):
    force = os.environ.get("DEMB_BUILD_CUDA", "")
    if force == "0":
        return False
    cuda_home = find_cuda_home()
    can = bool(torch.version.cuda) and cuda_home is not None
    if force == "1" and not can:
        sys.exit(
            "setup.py: DEMB_BUILD_CUDA=1 but %s"
            % ("torch has no CUDA" if not torch.version.cuda else "no CUDA toolkit (nvcc) found")
        )
    if can:
        # torch.utils.cpp_extension reads CUDA_HOME when it is imported.
        os.environ["CUDA_HOME"] = cuda_home
    return can


PREBUILT = "DEMB_PREBUILT_EXTENSION"


def prebuilt_extension():
    """The path DEMB_PREBUILT_EXTENSION names (checked), or None."""
    path = os.environ.get(PREBUILT)
    if not path:
        return None
    if not os.path.isabs(path):
        sys.exit("setup.py: %s=%r is not an absolute path" % (PREBUILT, path))
    if not os.path.isfile(path):
        sys.exit("setup.py: %s=%r is not a file" % (PREBUILT, path))
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            sys.exit("setup.py: %s=%r is not a shared library (ELF)" % (PREBUILT, path))
    return path


def stripping():
    """Whether the extension is stripped (DEMB_STRIP, default yes)."""
    return os.environ.get("DEMB_STRIP", "1") != "0"


def strip_all(path):
    """Drops the symbol table and debug info of a built extension (as -Wl,--strip-all)."""
    strip = shutil.which("strip")
    if strip is None:
        sys.exit("setup.py: no `strip` on PATH to strip %s (or set DEMB_STRIP=0)" % path)
    subprocess.run([strip, "--strip-all", path], check=True)


def packaging_build_ext(base, prebuilt):
    """build_ext that copies `prebuilt` where the extension would be built."""

    class PackagePrebuilt(base):
        def build_extensions(self):
            for ext in self.extensions:
                dest = self.get_ext_fullpath(ext.name)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(prebuilt, dest)
                os.chmod(dest, 0o755)
                if stripping():
                    strip_all(dest)

    return PackagePrebuilt


def extension_modules():
    import torch

    with_cuda = build_cuda_wanted(torch)
    from torch.utils import cpp_extension

    sources_bzl = read_sources()
    packages = sources_bzl["PACKAGES"]
    sources = [os.path.join(d, f) for d, p in packages.items() for f in p["cpu_srcs"]]
    depends = [os.path.join(d, f) for d, p in packages.items() for f in p["hdrs"]]
    depends.append("cc/sources.bzl")

    prebuilt = prebuilt_extension()
    if prebuilt is not None:
        print("setup.py: packaging the prebuilt %s as dynamicemb._C" % prebuilt)
        from setuptools import Extension

        ext = Extension(name="dynamicemb._C", sources=sources, depends=depends)
        return [ext], packaging_build_ext(cpp_extension.BuildExtension, prebuilt), torch

    std = cxx_std(torch)
    # -Wall -Wextra speak of our code only: torch's headers are searched as
    # system headers (GCC treats a directory given by -I and -isystem as the latter).
    cxx_flags = ["-O3", std, "-Wall", "-Wextra"]
    strip = stripping()
    if strip:
        # Python's CFLAGS ask for debug info (-g), which the stripped link
        # below drops: not making it takes a third off the compile.
        cxx_flags.append("-g0")
    cxx_flags += ["-isystem" + p for p in cpp_extension.include_paths()]
    macros = []
    kwargs = {}
    if with_cuda:
        sources += [os.path.join(d, f) for d, p in packages.items() for f in p["cuda_srcs"]]
        macros.append(("DEMB_WITH_CUDA", "1"))
        archs = os.environ.get("DEMB_CUDA_ARCHS") or ";".join(sources_bzl["CUDA_ARCHS"])
        nvcc_flags = ["-O3", std, "--expt-relaxed-constexpr", "-Xcompiler=-Wall,-Wextra"]
        nvcc_flags += gencode_flags(archs)
        kwargs["extra_compile_args"] = {"cxx": cxx_flags, "nvcc": nvcc_flags}
        ext_class = cpp_extension.CUDAExtension
        print(
            "setup.py: building dynamicemb._C with CUDA (%s, archs %s)"
            % (os.environ["CUDA_HOME"], archs)
        )
    else:
        kwargs["extra_compile_args"] = {"cxx": cxx_flags}
        ext_class = cpp_extension.CppExtension
        print("setup.py: building dynamicemb._C for CPU only")

    if strip:
        # No symbol table or debug info in the installed extension;
        # the dynamic symbols Python and torch resolve are kept.
        kwargs["extra_link_args"] = ["-Wl,--strip-all"]
    if sys.platform.startswith("linux"):
        # The shared libstdc++ by its file name, ahead of torch's libraries: a
        # toolchain that finds only the static archive for -lstdc++ would give
        # the extension a private copy of the standard library beside torch's.
        kwargs["libraries"] = [":libstdc++.so.6"]
    ext = ext_class(
        name="dynamicemb._C",
        sources=sources,
        depends=depends,
        include_dirs=[ROOT],
        define_macros=macros,
        **kwargs,
    )
    return [ext], cpp_extension.BuildExtension, torch


def link_with_cxx():
    """Links the extension with the C++ driver, as torch itself is linked.

    Some distributions' Pythons link extensions with `gcc -shared
    -Wl,-Bsymbolic-functions` (sysconfig LDSHARED); this keeps their flags but
    the C++ driver and drops -Bsymbolic-functions. An LDSHARED set by the
    caller is kept.
    """
    if "LDSHARED" in os.environ:
        return
    import sysconfig

    ldshared = (sysconfig.get_config_var("LDSHARED") or "").split()
    if not ldshared:
        return
    cxx = os.environ.get("CXX", "c++")
    flags = [f for f in ldshared[1:] if f != "-Wl,-Bsymbolic-functions"]
    os.environ["LDSHARED"] = " ".join([cxx] + flags)


def main():
    os.chdir(ROOT)  # the source paths are relative to the project root
    link_with_cxx()
    ext_modules, build_ext, torch = extension_modules()
    for_sdist = "sdist" in sys.argv[1:]
    setup(
        ext_modules=ext_modules,
        cmdclass={"build_ext": build_ext},
        # pyproject.toml declares the dependencies and the extras dynamic.
        install_requires=[torch_requirement(torch, for_sdist)] + REQUIRES,
        extras_require=extras(torch, for_sdist),
    )


if __name__ == "__main__":
    main()
