"""Repository rules that find the local Python, torch and pybind11 by running Python.

  local_python_configure(name = "local_config_python")
      @local_config_python//:py_toolchain     Python toolchain (register it) running the
                                              chosen interpreter, also for py_test stubs
      @local_config_python//:python_headers   Python.h and friends
  local_torch(name = "local_torch")
      @local_torch//:torch          headers and libc10/libtorch_cpu/libtorch
      @local_torch//:torch_cuda     libc10_cuda/libtorch_cuda (only with a CUDA torch)
      @local_torch//:torch_python   libtorch_python, for extensions that bind to Python
      @local_torch//:pybind11       the pybind11 bundled with torch (use it for torch
                                    extensions, never together with @pybind11)
      @local_torch//:defs.bzl       TORCH_VERSION, TORCH_CUDA_VERSION, TORCH_CUDA
  local_pybind11(name = "pybind11")
      @pybind11//:pybind11          pip's pybind11 (for plain pybind11 modules)

The interpreter is, in this order:
  1. $PYTHON_BIN_PATH (pass it with --repo_env=PYTHON_BIN_PATH=/path/to/python),
  2. <workspace>/.venv/bin/python (what tools/setup_env.sh creates),
  3. python3 on PATH.
The repositories symlink into the interpreter's installation; nothing is copied. They
are `local`, so they are re-evaluated by every new Bazel server.
"""

def _workspace_dir(rctx):
    # This file is <workspace>/tools/local_python.bzl.
    return rctx.path(Label("//tools:local_python.bzl")).dirname.dirname

def _find_python(rctx):
    env = rctx.os.environ.get("PYTHON_BIN_PATH", "")
    if env:
        if not rctx.path(env).exists:
            fail("PYTHON_BIN_PATH=%s does not exist" % env)
        return env
    venv_python = _workspace_dir(rctx).get_child(".venv").get_child("bin").get_child("python")
    if venv_python.exists:
        return str(venv_python)
    python3 = rctx.which("python3")
    if not python3:
        fail("No Python found: run tools/setup_env.sh, or pass --repo_env=PYTHON_BIN_PATH=...")
    return str(python3)

def _probe(rctx, python, code, what):
    """Runs `code` (which prints one JSON object) with `python`; returns the dict."""
    rctx.file("_probe.py", code)
    res = rctx.execute([python, "-I", str(rctx.path("_probe.py"))], quiet = True)
    rctx.delete("_probe.py")
    if res.return_code != 0:
        fail("Probing %s with %s failed:\n%s%s" % (what, python, res.stdout, res.stderr))
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
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)

_TORCH_PROBE = """\
import json, os
import torch
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
    deps = ["@local_config_python//:python_headers"],
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
        "@local_config_python//:python_headers",
    ],
)
{cuda_targets}"""

_TORCH_CUDA_TARGETS = """
cc_library(
    name = "torch_cuda",
    srcs = [
        "lib/libc10_cuda.so",
        "lib/libtorch_cuda.so",
    ],
    deps = [
        ":torch",
        "@cuda//:cuda_headers",
    ],
)
"""

_TORCH_DEFS = """\
\"\"\"Facts about the local torch, generated by //tools:local_python.bzl.\"\"\"

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
    environ = ["PYTHON_BIN_PATH", "DEMB_TORCH_CUDA"],
    local = True,
)

_PYBIND11_PROBE = """\
import json
import pybind11
print(json.dumps({"include": pybind11.get_include(), "version": pybind11.__version__}))
"""

_PYBIND11_BUILD = """\
load("@rules_cc//cc:defs.bzl", "cc_library")

package(default_visibility = ["//visibility:public"])

# pybind11 {version}

cc_library(
    name = "pybind11",
    hdrs = glob(["include/pybind11/**/*.h"]),
    includes = ["include"],
    deps = ["@local_config_python//:python_headers"],
)
"""

def _local_pybind11_impl(rctx):
    python = _find_python(rctx)
    info = _probe(rctx, python, _PYBIND11_PROBE, "pybind11")
    rctx.symlink(info["include"], "include")
    rctx.file("BUILD.bazel", _PYBIND11_BUILD.format(version = info["version"]))

local_pybind11 = repository_rule(
    implementation = _local_pybind11_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
