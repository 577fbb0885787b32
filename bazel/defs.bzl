"""The C++ and CUDA rules dynamicemb's BUILD files use, with what its code needs.

`cc_library`, `cc_binary`, `cc_test` (rules_cc) and `cuda_library` (rules_cuda) with
the settings every target of dynamicemb compiles with, so that they hold wherever the
targets are built, dynamicemb's own workspace or one that depends on it, whatever its
.bazelrc says:
  * C++20 (COPTS; torch 2.13's headers need it), for nvcc too (CUDA_COPTS);
  * the libraries' host code optimized at -O3, as setup.py builds it, in Bazel's
    default (fastbuild) mode too, since its kernels are the library's CPU backend
    (-c dbg keeps Bazel's debug flags; a test's own code keeps the mode's flags);
  * device code for the archs of CUDA_ARCHS in cc/sources.bzl, the archs setup.py
    builds for too, unless --@rules_cuda//cuda:archs is given (then those).
The CUDA runtime is rules_cuda's choice (--@rules_cuda//cuda:runtime): the offline
stand-in links the static cudart.

Code outside dynamicemb that includes its headers compiles with C++17 or later; COPTS
is what dynamicemb uses.
"""

load("@rules_cc//cc:defs.bzl", _cc_binary = "cc_binary", _cc_library = "cc_library", _cc_test = "cc_test")
load("@rules_cuda//cuda:defs.bzl", _cuda_library = "cuda_library")
load("//:cc/sources.bzl", "CUDA_ARCHS")

# A later -std wins over the toolchain's default (Bazel 4: -std=c++0x) and --cxxopt.
COPTS = ["-std=c++20"]

CUDA_COPTS = ["-std=c++20"]

def optimized():
    """-O3 unless the build is -c dbg (a later -O wins over the mode's own)."""
    return select({
        str(Label("//bazel:debug_build")): [],
        "//conditions:default": ["-O3"],
    })

def cuda_archs():
    """rules_cuda arch specs: SASS for each of CUDA_ARCHS, unless the flag is given."""
    return select({
        str(Label("//bazel:cuda_archs_unset")): ["compute_%s:sm_%s" % (a, a) for a in CUDA_ARCHS],
        "//conditions:default": [],
    })

def cc_library(copts = [], **kwargs):
    _cc_library(copts = COPTS + optimized() + copts, **kwargs)

def cc_binary(copts = [], **kwargs):
    _cc_binary(copts = COPTS + optimized() + copts, **kwargs)

def cc_test(copts = [], **kwargs):
    _cc_test(copts = COPTS + copts, **kwargs)

def cuda_library(copts = [], **kwargs):
    _cuda_library(
        archs = cuda_archs(),
        copts = CUDA_COPTS + copts,
        host_copts = optimized(),
        **kwargs
    )
