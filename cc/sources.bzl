"""The one list of C++/CUDA sources of the extension, and the GPUs they are built for.

Read by the Bazel BUILD files (load) and by setup.py (exec), so both builds
compile exactly the same files for the same GPUs. Keep it to plain literals:
setup.py evaluates it as Python.
"""

# Compute capabilities the device code is compiled for (SASS) unless the build
# is told otherwise (setup.py: DEMB_CUDA_ARCHS; Bazel: --@rules_cuda//cuda:archs):
# A100 (8.0) and H100/H200 (9.0).
CUDA_ARCHS = ["80", "90"]

# Paths are relative to each package directory.

# //cc/common: the host-device marker (no torch, no CUDA) and the CUDA launch
# and error-check helpers (CUDA runtime only).
COMMON_HDRS = ["host_device.h"]

COMMON_CUDA_HDRS = ["cuda_launch.cuh"]

# //cc/table:table_core (header-only, no torch, no CUDA): the table's
# semantics, one definition for both backends.
TABLE_CORE_HDRS = [
    "types.h",
    "table_ref.h",
    "hash.h",
    "layout.h",
    "scores.h",
    "operations.h",
    "rows.h",
    "row_check.h",
    "tile_run.h",
]

# //cc/table:table_cpu and //cc/table:table_cuda.
TABLE_CPU_HDRS = ["table_cpu.h"]

TABLE_CUDA_HDRS = ["table_cuda.h"]

# Private to //cc/table:table_cuda.
TABLE_CUDA_PRIVATE_HDRS = ["table_cuda_shared.cuh", "tile_probe.cuh"]

TABLE_HDRS = TABLE_CORE_HDRS + TABLE_CPU_HDRS + TABLE_CUDA_HDRS + TABLE_CUDA_PRIVATE_HDRS

TABLE_CPU_SRCS = ["table_cpu.cpp"]

TABLE_CUDA_SRCS = [
    "table_cuda_check.cu",
    "table_cuda_export.cu",
    "table_cuda_find.cu",
    "table_cuda_run.cu",
    "table_cuda_shared.cu",
    "table_cuda_tile_run.cu",
]

# //cc/embedding: initializers (counter-based random rows), fused optimizers,
# pooling (the forward into TorchRec's layout, gradient reduction + update backward),
# the segmented unique of a batch's (table, key) pairs.
EMBEDDING_CORE_HDRS = [
    "fp8_rows.h",
    "initializer.h",
    "optimizer.h",
    "philox.h",
    "pooling.h",
    "unique.h",
]

EMBEDDING_CPU_HDRS = [
    "cpu_features.h",
    "fp8_rows_cpu.h",
    "initializer_cpu.h",
    "optimizer_cpu.h",
    "pooling_cpu.h",
    "prefetch_cpu.h",
    "unique_cpu.h",
]

EMBEDDING_CUDA_HDRS = [
    "initializer_cuda.h",
    "optimizer_cuda.h",
    "pooling_cuda.h",
    "unique_cuda.h",
    "warp_update.cuh",
]

EMBEDDING_HDRS = EMBEDDING_CORE_HDRS + EMBEDDING_CPU_HDRS + EMBEDDING_CUDA_HDRS

EMBEDDING_CPU_SRCS = [
    "fp8_rows_cpu.cpp",
    "initializer_cpu.cpp",
    "optimizer_cpu.cpp",
    "pooling_cpu.cpp",
    "unique_cpu.cpp",
]

EMBEDDING_CUDA_SRCS = ["initializer_cuda.cu", "optimizer_cuda.cu", "pooling_cuda.cu", "unique_cuda.cu"]

# //cc/admission: the admission counter, a counter table run by the table's
# backends (counter_core: its run arguments; counter_cpu, counter_cuda).
ADMISSION_CORE_HDRS = ["counter.h"]

ADMISSION_CPU_HDRS = ["counter_cpu.h"]

ADMISSION_CUDA_HDRS = ["counter_cuda.h"]

ADMISSION_CPU_SRCS = ["counter_cpu.cpp"]

ADMISSION_CUDA_SRCS = ["counter_cuda.cu"]

# //cc/storage: the row space (row layout, element types, two segments) shared by
# the embedding kernels and the row moves (storage_core, header-only, no torch),
# and the copy_rows kernels.
STORAGE_CORE_HDRS = ["row_space.h", "copy_rows.h"]

STORAGE_CPU_HDRS = ["copy_rows_cpu.h"]

STORAGE_CUDA_HDRS = ["copy_rows_cuda.h"]

STORAGE_HDRS = STORAGE_CORE_HDRS + STORAGE_CPU_HDRS + STORAGE_CUDA_HDRS

STORAGE_CPU_SRCS = ["copy_rows_cpu.cpp"]

STORAGE_CUDA_SRCS = ["copy_rows_cuda.cu"]

# //cc/routing:routing_core (row-wise key -> rank routing and the sharded
# batch's value checks, host/device inline, no torch) and
# //cc/routing:routing_cuda (their torch-free CUDA kernels).
ROUTING_HDRS = [
    "batch_check.h",
    "routing.h",
]

ROUTING_CUDA_HDRS = [
    "batch_check_cuda.h",
    "routing_cuda.h",
]

ROUTING_CUDA_SRCS = [
    "batch_check_cuda.cu",
    "routing_cuda.cu",
]

# //cc/ops: the torch op layer. Argument checks shared by an op's kernels.
OPS_HDRS = [
    "counter_args.h",
    "cuda_scratch.h",
    "embedding_args.h",
    "routing_args.h",
    "storage_args.h",
    "table_args.h",
    "tensor_checks.h",
    "unique_args.h",
]

# Op schemas, CPU and Meta kernels, and the Python module entry point.
OPS_SRCS = [
    "schemas.cpp",
    "table_ops_cpu.cpp",
    "counter_ops_cpu.cpp",
    "embedding_ops_cpu.cpp",
    "routing_ops_cpu.cpp",
    "storage_ops_cpu.cpp",
    "unique_ops_cpu.cpp",
    "ops_meta.cpp",
    "module.cpp",
]

# CUDA kernels of the ops: built only against a CUDA-enabled torch.
OPS_CUDA_SRCS = [
    "table_ops_cuda.cpp",
    "counter_ops_cuda.cpp",
    "embedding_ops_cuda.cpp",
    "routing_ops_cuda.cpp",
    "storage_ops_cuda.cpp",
    "unique_ops_cuda.cpp",
]

PACKAGES = {
    "cc/common": {"hdrs": COMMON_HDRS + COMMON_CUDA_HDRS, "cpu_srcs": [], "cuda_srcs": []},
    "cc/table": {"hdrs": TABLE_HDRS, "cpu_srcs": TABLE_CPU_SRCS, "cuda_srcs": TABLE_CUDA_SRCS},
    "cc/admission": {
        "hdrs": ADMISSION_CORE_HDRS + ADMISSION_CPU_HDRS + ADMISSION_CUDA_HDRS,
        "cpu_srcs": ADMISSION_CPU_SRCS,
        "cuda_srcs": ADMISSION_CUDA_SRCS,
    },
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
    "cc/routing": {
        "hdrs": ROUTING_HDRS + ROUTING_CUDA_HDRS,
        "cpu_srcs": [],
        "cuda_srcs": ROUTING_CUDA_SRCS,
    },
    "cc/ops": {
        "hdrs": OPS_HDRS,
        "cpu_srcs": OPS_SRCS,
        "cuda_srcs": OPS_CUDA_SRCS,
    },
}
