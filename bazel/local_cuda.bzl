"""Repository rule `local_cuda`: the installed CUDA toolkit, for the rules_cuda stand-in.

dynamicemb_repositories() creates it as `@dynamicemb_cuda` when the workspace has no
rules_cuda of its own (Bazel 4, offline). It offers the labels of the real rules_cuda
toolkit repository:
  :nvcc                  the compiler driver
  :compiler_deps         everything nvcc reads (bin, nvvm, headers incl. CCCL/CUB)
  :cuda_runtime          shared cudart
  :cuda_runtime_static   static cudart (the stand-in's default runtime)

The toolkit is looked up in this order:
  1. $CUDA_PATH (pass it with --repo_env=CUDA_PATH=...),
  2. /usr/local/cuda,
  3. the real location of `nvcc` on PATH (readlink -f).
A candidate counts only if it has bin/nvcc.profile: /usr/local/bin/nvcc may be a wrapper
script, and /usr/local is not a toolkit.
Without a toolkit the repository still loads, and any CUDA compile fails with a message
saying what to install.
"""

def _is_toolkit(rctx, path):
    # nvcc.profile sits next to the real nvcc, not next to a wrapper script.
    return path and rctx.path(path).get_child("bin").get_child("nvcc.profile").exists

def _find_toolkit(rctx):
    candidates = []
    cuda_path = rctx.os.environ.get("CUDA_PATH", "")
    if cuda_path:
        candidates.append(cuda_path)
    candidates.append("/usr/local/cuda")
    nvcc = rctx.which("nvcc")
    if nvcc:
        res = rctx.execute(["readlink", "-f", str(nvcc)])
        if res.return_code == 0 and res.stdout.strip():
            candidates.append(str(rctx.path(res.stdout.strip()).dirname.dirname))
    for c in candidates:
        if _is_toolkit(rctx, c):
            return c
    return None

def _lib_dir(rctx, root):
    # Where libcudart_static.a lives: lib64 (runfile installer), lib (pip wheels),
    # or targets/<arch>/lib.
    for sub in [["lib64"], ["lib"], ["targets", "x86_64-linux", "lib"], ["targets", "sbsa-linux", "lib"]]:
        p = rctx.path(root)
        for s in sub:
            p = p.get_child(s)  # one segment at a time: Bazel 4 crashes on "a/b"
        if p.get_child("libcudart_static.a").exists:
            return p
    return None

# The start of both BUILD files: {note} says what was found.
_BUILD_HEAD = """\
load("@rules_cc//cc:defs.bzl", "cc_library")

package(default_visibility = ["//visibility:public"])

# {note}

filegroup(
    name = "nvcc",
    srcs = ["bin/nvcc"],
)
"""

_BUILD = _BUILD_HEAD + """
filegroup(
    name = "compiler_deps",
    srcs = glob(["bin/**", "nvvm/**", "include/**", "targets/*/include/**"]),
)

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"], allow_empty = True, exclude = ["include/cccl/**"]),
    includes = ["include"],
)

cc_library(
    name = "cuda_runtime",
    srcs = glob(["lib/libcudart.so*"], allow_empty = True),
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cuda_runtime_static",
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)
"""

_BUILD_MISSING = _BUILD_HEAD + """
filegroup(
    name = "compiler_deps",
    srcs = [],
)

cc_library(name = "cuda_headers")

cc_library(name = "cuda_runtime")

cc_library(name = "cuda_runtime_static")
"""

_NVCC_MISSING = """\
#!/bin/sh
echo "No CUDA toolkit found ({why})." >&2
echo "Install one (nvcc, cudart, CCCL) or pass --repo_env=CUDA_PATH=/path/to/cuda." >&2
exit 1
"""

def _local_cuda_impl(rctx):
    root = _find_toolkit(rctx)
    lib = _lib_dir(rctx, root) if root else None
    if not root or not lib:
        why = "no bin/nvcc under $CUDA_PATH, /usr/local/cuda or PATH" if not root else "no libcudart_static.a under " + root
        rctx.file("bin/nvcc", _NVCC_MISSING.format(why = why), executable = True)
        rctx.file("BUILD.bazel", _BUILD_MISSING.format(note = "No CUDA toolkit found: " + why))
        return
    base = rctx.path(root)
    for d in ["bin", "include", "nvvm", "targets"]:
        if base.get_child(d).exists:
            rctx.symlink(base.get_child(d), d)
    rctx.symlink(lib, "lib")
    rctx.file("BUILD.bazel", _BUILD.format(note = "Toolkit: " + root))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_PATH", "PATH"],
    local = True,
)
