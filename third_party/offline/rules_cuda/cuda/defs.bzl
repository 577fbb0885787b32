"""Offline stand-in for @rules_cuda//cuda:defs.bzl (compile-only, nvcc only).

See private/cuda_library.bzl. The CUDA toolkit repository `@dynamicemb_cuda` is
created by dynamicemb_repositories() (dynamicemb's //bazel:local_cuda.bzl); under
Bzlmod the real rules_cuda and its toolkit repository are used instead.
"""

load("//cuda/private:cuda_library.bzl", _cuda_library = "cuda_library")
load("//cuda/private:flags.bzl", _CudaArchsInfo = "CudaArchsInfo")

cuda_library = _cuda_library
CudaArchsInfo = _CudaArchsInfo
