"""Offline stand-in for @pybind11_bazel//:build_defs.bzl.

Same names and outputs as the real macros: `pybind_extension(name = "foo")` makes the
shared object `foo.so`. The headers come from `@pybind11` (pip's pybind11, found by
//tools:local_python.bzl), which also brings the Python headers.

Torch extensions do not use this: they must compile against the pybind11 bundled with
torch (see @local_torch//:pybind11).
"""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library")

PYBIND_COPTS = ["-fexceptions"]

PYBIND_DEPS = ["@pybind11"]

def pybind_extension(name, copts = [], linkopts = [], deps = [], **kwargs):
    cc_binary(
        name = name + ".so",
        copts = copts + PYBIND_COPTS + ["-fvisibility=hidden"],
        linkopts = linkopts + ["-Wl,-Bsymbolic"],
        linkshared = True,
        deps = deps + PYBIND_DEPS,
        **kwargs
    )

def pybind_library(name, copts = [], deps = [], **kwargs):
    cc_library(
        name = name,
        copts = copts + PYBIND_COPTS,
        deps = deps + PYBIND_DEPS,
        **kwargs
    )
