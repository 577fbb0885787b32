"""The one list of C++/CUDA sources of the extension.

Read by the Bazel BUILD files (load) and by setup.py (exec), so both builds
compile exactly the same files. Keep it to plain literals: setup.py evaluates
it as Python.
"""

# Paths are relative to each package directory.
# //cc/table:table_core (header-only, no torch, no CUDA).
TABLE_CORE_HDRS = [
    "types.h",
    "table_common.h",
    "table_ref.h",
]

# //cc/table:table_cpu and //cc/table:table_cuda.
TABLE_CPU_HDRS = ["table_cpu.h"]

TABLE_CUDA_HDRS = ["table_cuda.h"]

TABLE_HDRS = TABLE_CORE_HDRS + TABLE_CPU_HDRS + TABLE_CUDA_HDRS

TABLE_CPU_SRCS = ["table_cpu.cpp"]

TABLE_CUDA_SRCS = ["table_cuda.cu"]

# //cc/embedding: initializers (counter-based random rows), fused optimizers, the
# fused lookup (pooling forward, gradient reduction + update backward).
EMBEDDING_CORE_HDRS = ["initializer.h", "lookup.h", "optimizer.h"]

EMBEDDING_CPU_HDRS = ["initializer_cpu.h", "lookup_cpu.h", "optimizer_cpu.h"]

EMBEDDING_CUDA_HDRS = ["initializer_cuda.h", "lookup_cuda.h", "optimizer_cuda.h", "warp_update.cuh"]

EMBEDDING_HDRS = EMBEDDING_CORE_HDRS + EMBEDDING_CPU_HDRS + EMBEDDING_CUDA_HDRS

EMBEDDING_CPU_SRCS = ["initializer_cpu.cpp", "lookup_cpu.cpp", "optimizer_cpu.cpp"]

EMBEDDING_CUDA_SRCS = ["initializer_cuda.cu", "lookup_cuda.cu", "optimizer_cuda.cu"]

# //cc/storage: the row space (row layout, element types, two segments) shared by
# the lookup kernels and the row moves (storage_core, header-only), and the
# copy_rows kernels.
STORAGE_CORE_HDRS = ["row_space.h", "copy_rows.h"]

STORAGE_CPU_HDRS = ["copy_rows_cpu.h"]

STORAGE_CUDA_HDRS = ["copy_rows_cuda.h"]

STORAGE_HDRS = STORAGE_CORE_HDRS + STORAGE_CPU_HDRS + STORAGE_CUDA_HDRS

STORAGE_CPU_SRCS = ["copy_rows_cpu.cpp"]

STORAGE_CUDA_SRCS = ["copy_rows_cuda.cu"]

OPS_HDRS = ["lookup_ops.h", "ops_common.h", "storage_ops.h"]

# //cc/ops:routing_core (row-wise key -> rank routing, host/device inline, no
# torch) and //cc/ops:routing_cuda (its torch-free CUDA kernel).
ROUTING_HDRS = ["routing.h"]

ROUTING_CUDA_HDRS = ["routing_cuda.h"]

ROUTING_CUDA_SRCS = ["routing_cuda.cu"]

# Torch op schemas, CPU and Meta kernels, and the Python module entry point.
OPS_SRCS = [
    "lookup_ops.cpp",
    "ops.cpp",
    "ops_cpu.cpp",
    "ops_meta.cpp",
    "storage_ops.cpp",
    "module.cpp",
]

# CUDA dispatch registrations: built only against a CUDA-enabled torch.
OPS_CUDA_SRCS = ["lookup_ops_cuda.cpp", "ops_cuda.cpp", "storage_ops_cuda.cpp"]

PACKAGES = {
    "cc/table": {"hdrs": TABLE_HDRS, "cpu_srcs": TABLE_CPU_SRCS, "cuda_srcs": TABLE_CUDA_SRCS},
    "cc/embedding": {
        "hdrs": EMBEDDING_HDRS,
        "cpu_srcs": EMBEDDING_CPU_SRCS,
        "cuda_srcs": EMBEDDING_CUDA_SRCS,
    },
    "cc/storage": {
        "hdrs": STORAGE_HDRS,
        "cpu_srcs": STORAGE_CPU_SRCS,
        "cuda_srcs": STORAGE_CUDA_SRCS,
    },
    "cc/ops": {
        "hdrs": OPS_HDRS + ROUTING_HDRS + ROUTING_CUDA_HDRS,
        "cpu_srcs": OPS_SRCS,
        "cuda_srcs": OPS_CUDA_SRCS + ROUTING_CUDA_SRCS,
    },
}
