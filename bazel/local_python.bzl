"""Repository rules that find the interpreter and its torch by running Python.

  local_python_configure(name = "dynamicemb_python")
      @dynamicemb_python//:py_toolchain     Python toolchain running the interpreter,
                                            also for the py_test/py_binary launcher
      @dynamicemb_python//:python_headers   Python.h and friends
  local_torch(name = "dynamicemb_torch")
      @dynamicemb_torch//:torch          headers and libc10/libtorch_cpu/libtorch
      @dynamicemb_torch//:torch_cuda     libc10_cuda/libtorch_cuda (only with a CUDA torch)
      @dynamicemb_torch//:torch_python   libtorch_python, for extensions bound to Python
      @dynamicemb_torch//:pybind11       the pybind11 bundled with torch (what torch
                                         extensions must build against)
      @dynamicemb_torch//:defs.bzl       TORCH_VERSION, TORCH_CUDA_VERSION, TORCH_CUDA

The interpreter (the same for both, so torch's headers match the torch the tests
import) is, in this order:
  1. $PYTHON_BIN_PATH (pass it with --repo_env=PYTHON_BIN_PATH=/path/to/python),
  2. .venv/bin/python in the workspace Bazel runs in (the main workspace, also when
     dynamicemb is an external repository of it; tools/setup_env.sh creates this one
     for dynamicemb's own checkout). Bazel 4 cannot name that workspace to a
     repository rule; it is found from the working directory of the bazel command
     when the output base is the default one, else through a root BUILD file.
Anything else is an error that names both ways. The repositories symlink into the
interpreter's installation; nothing is copied. They are `local`, so every new Bazel
server probes again.
"""

_PYTHON_ENV = "PYTHON_BIN_PATH"

def _main_workspace_dir(rctx):
    """The directory of the workspace Bazel was started in, or None.

    None when it cannot be told without a root BUILD file (Bazel 4 only).
    """
    if hasattr(rctx, "workspace_root"):  # Bazel >= 6
        return rctx.workspace_root

    # Bazel 4 has no workspace_root. The client's working directory ($PWD) lies in
    # the workspace: its first ancestor with a WORKSPACE file is the workspace, if
    # the output base is named after that path (Bazel's default output base is the
    # MD5 of the workspace's path). Otherwise a main-repository label tells, which
    # needs a root package (a BUILD file at the workspace root).
    found = _workspace_from_pwd(rctx)
    if found and _names_output_base(rctx, found):
        return found
    if found and not (found.get_child("BUILD").exists or found.get_child("BUILD.bazel").exists):
        return None
    return rctx.path(Label("@//:WORKSPACE")).dirname

def _workspace_from_pwd(rctx):
    pwd = rctx.os.environ.get("PWD", "")
    if not pwd or not rctx.path(pwd).exists:
        return None
    path = rctx.path(pwd).realpath
    for _ in range(128):
        if path.get_child("WORKSPACE").exists or path.get_child("WORKSPACE.bazel").exists:
            return path
        path = path.dirname
        if path == None:
            return None
    return None

def _names_output_base(rctx, workspace):
    """Whether the output base is the default one of `workspace`.

    Bazel names a default output base after the MD5 of the workspace's path.
    """
    res = rctx.execute(["sh", "-c", 'printf %s "$1" | md5sum', "sh", str(workspace)], quiet = True)
    output_base = rctx.path(".").dirname.dirname  # <output_base>/external/<this repository>
    return res.return_code == 0 and res.stdout.split(" ")[0] == output_base.basename

def _find_python(rctx):
    """The interpreter's path (see the module docstring); fails with what to do."""
    env = rctx.os.environ.get(_PYTHON_ENV, "")
    if env:
        if not rctx.path(env).exists:
            fail("dynamicemb: %s=%s does not exist." % (_PYTHON_ENV, env))
        return env
    workspace = _main_workspace_dir(rctx)
    where = "at the workspace's root"
    if workspace:
        venv_python = workspace.get_child(".venv").get_child("bin").get_child("python")
        if venv_python.exists:
            return str(venv_python)
        where = "at %s" % venv_python
    fail(("dynamicemb: no Python interpreter to build and test with. Give one either way: " +
          "(1) name it with --repo_env=%s=/path/to/venv/bin/python (a line " +
          "'build --repo_env=%s=...' in the workspace's .bazelrc, or on the command line); " +
          "(2) create a virtual environment with torch %s (python3 -m venv .venv && " +
          ".venv/bin/pip install torch) and list .venv in .bazelignore.") %
         (_PYTHON_ENV, _PYTHON_ENV, where))

def _probe(rctx, python, code, what):
    """Runs `code` (which prints one JSON object) with `python`; returns the dict."""
    rctx.file("_probe.py", code)
    res = rctx.execute([python, "-I", str(rctx.path("_probe.py"))], quiet = True)
    rctx.delete("_probe.py")
    if res.return_code != 0:
        fail("dynamicemb: probing %s with %s failed:\n%s%s" % (what, python, res.stdout, res.stderr))
    return json.decode(res.stdout.strip().splitlines()[-1])

_PYTHON_PROBE = """\
import json, sys, sysconfig
print(json.dumps({
    "include": sysconfig.get_paths()["include"],
    "version": "%d.%d" % sys.version_info[:2],
}))
"""

_PYTHON_BUILD = """\
load("@rules_cc//cc:defs.bzl", "cc_library")
load("@rules_python//python:defs.bzl", "py_runtime", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

# Interpreter: {python} (Python {version})

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    # The test/binary launcher is a Python script; Debian has no `python` on PATH.
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@rules_python//python:toolchain_type",
)

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)
"""

def _local_python_configure_impl(rctx):
    python = _find_python(rctx)
    info = _probe(rctx, python, _PYTHON_PROBE, "the Python installation")
    rctx.symlink(info["include"], "python_include")
    rctx.file("BUILD.bazel", _PYTHON_BUILD.format(python = python, version = info["version"]))

local_python_configure = repository_rule(
    implementation = _local_python_configure_impl,
    environ = [_PYTHON_ENV],
    local = True,
)

_TORCH_PROBE = """\
import json, os, sys
try:
    import torch
except ImportError as e:
    sys.exit("this interpreter has no torch (%s); install it into the same environment" % e)
print(json.dumps({
    "dir": os.path.dirname(torch.__file__),
    "version": torch.__version__,
    "cuda": torch.version.cuda or "",
    "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
}))
"""

_TORCH_BUILD = """\
load("@rules_cc//cc:defs.bzl", "cc_library")

package(default_visibility = ["//visibility:public"])

# torch {version} from {dir}

exports_files(["defs.bzl"])

cc_library(
    name = "pybind11",
    hdrs = glob(["include/pybind11/**/*.h"]),
    includes = ["include"],
    deps = ["@dynamicemb_python//:python_headers"],
)

cc_library(
    name = "torch",
    srcs = [
        "lib/libc10.so",
        "lib/libtorch_cpu.so",
        "lib/libtorch.so",
    ],
    hdrs = glob(
        ["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"],
        allow_empty = True,
        exclude = ["include/pybind11/**"],
    ),
    defines = ["_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"],
    includes = [
        "include",
        "include/torch/csrc/api/include",
    ],
    linkopts = ["-lpthread"],
)

cc_library(
    name = "torch_python",
    srcs = ["lib/libtorch_python.so"],
    defines = ["TORCH_API_INCLUDE_EXTENSION_H"],
    deps = [
        ":pybind11",
        ":torch",
        "@dynamicemb_python//:python_headers",
    ],
)
{cuda_targets}"""

# The CUDA runtime's headers come with the runtime rules_cuda links
# (--@rules_cuda//cuda:runtime): the same label with the real rules_cuda and the
# offline stand-in.
_TORCH_CUDA_TARGETS = """
cc_library(
    name = "torch_cuda",
    srcs = [
        "lib/libc10_cuda.so",
        "lib/libtorch_cuda.so",
    ],
    deps = [
        ":torch",
        "@rules_cuda//cuda:runtime",
    ],
)
"""

_TORCH_DEFS = """\
\"\"\"Facts about the local torch, generated by @dynamicemb//bazel:local_python.bzl.\"\"\"

TORCH_VERSION = "{version}"

# CUDA version torch was built with; empty for a CPU-only torch.
TORCH_CUDA_VERSION = "{cuda}"

# True when torch has CUDA support: the CUDA op registrations are built then.
TORCH_CUDA = {has_cuda}
"""

def _local_torch_impl(rctx):
    python = _find_python(rctx)
    info = _probe(rctx, python, _TORCH_PROBE, "torch")
    has_cuda = bool(info["cuda"])
    force = rctx.os.environ.get("DEMB_TORCH_CUDA", "")
    if force in ["0", "1"]:
        has_cuda = force == "1"
    torch_dir = rctx.path(info["dir"])
    rctx.symlink(torch_dir.get_child("include"), "include")
    rctx.symlink(torch_dir.get_child("lib"), "lib")
    rctx.file("BUILD.bazel", _TORCH_BUILD.format(
        version = info["version"],
        dir = info["dir"],
        cxx11_abi = info["cxx11_abi"],
        cuda_targets = _TORCH_CUDA_TARGETS if has_cuda else "",
    ))
    rctx.file("defs.bzl", _TORCH_DEFS.format(
        version = info["version"],
        cuda = info["cuda"],
        has_cuda = "True" if has_cuda else "False",
    ))

local_torch = repository_rule(
    implementation = _local_torch_impl,
    environ = [_PYTHON_ENV, "DEMB_TORCH_CUDA"],
    local = True,
)
