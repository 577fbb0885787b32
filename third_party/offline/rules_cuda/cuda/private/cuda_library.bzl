"""Compile-only cuda_library for the rules_cuda stand-in.

`cuda_library(name, srcs, hdrs, deps, ...)` expands to
  * `<name>_cuda_objs`: one nvcc action per .cu file, producing position-independent
    objects with device code for the archs of --@rules_cuda//cuda:archs;
  * `<name>`: a cc_library over those objects, with `hdrs`, `deps` and the CUDA
    runtime (--@rules_cuda//cuda:runtime), so C++ targets depend on it as usual.

The CUDA toolkit is the repository `@dynamicemb_cuda` (made by dynamicemb's
//bazel:local_cuda.bzl). As with the real rules_cuda, a target's `archs` replace
--@rules_cuda//cuda:archs for that target.

Not supported (not needed here): relocatable device code and device linking,
clang as CUDA compiler, cuda_binary/cuda_test.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load(":flags.bzl", "CudaArchsInfo", "CudaFlagInfo", "parse_archs")

_CUDA_SRC_EXTS = [".cu", ".cu.cc"]
_HDR_EXTS = [".h", ".hh", ".hpp", ".cuh", ".inl", ".inc"]

def _is_cuda_src(f):
    for ext in _CUDA_SRC_EXTS:
        if f.basename.endswith(ext):
            return True
    return False

def _package_dir(label):
    parts = [p for p in [label.workspace_root, label.package] if p]
    return "/".join(parts)

def _stem(f):
    for ext in _CUDA_SRC_EXTS:
        if f.basename.endswith(ext):
            return f.basename[:-len(ext)]
    return f.basename

def _cuda_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    deps_ctx = cc_common.merge_cc_infos(
        cc_infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d],
    ).compilation_context

    srcs = [f for f in ctx.files.srcs if _is_cuda_src(f)]
    private_hdrs = [f for f in ctx.files.srcs if not _is_cuda_src(f)]

    pkg = _package_dir(ctx.label)
    include_dirs = []
    for inc in ctx.attr.includes:
        d = pkg + "/" + inc if pkg else inc
        include_dirs += [d, ctx.bin_dir.path + "/" + d]

    # nvcc has no -iquote: quote includes become plain -I (workspace root, bin dir,
    # external repositories), once each.
    iquote_dirs = []
    for d in [".", ctx.bin_dir.path] + deps_ctx.quote_includes.to_list():
        if d not in iquote_dirs:
            iquote_dirs.append(d)

    mode = ctx.var.get("COMPILATION_MODE", "fastbuild")
    mode_flags = {"opt": ["-O3", "-DNDEBUG"], "dbg": ["-g"]}.get(mode, [])

    if ctx.attr.archs:
        specs = []
        for value in ctx.attr.archs:
            specs += parse_archs(value)
    else:
        specs = ctx.attr._archs[CudaArchsInfo].gencode
    gencode = []
    for virtual, codes in specs:
        code = codes[0] if len(codes) == 1 else "[%s]" % ",".join(codes)
        gencode.append("-gencode=arch=%s,code=%s" % (virtual, code))

    inputs = depset(
        srcs + private_hdrs + ctx.files.hdrs,
        transitive = [
            deps_ctx.headers,
            depset(ctx.files._compiler_deps),
            cc_toolchain.all_files,
        ],
    )

    objects = []
    for src in srcs:
        obj = ctx.actions.declare_file("_objs/%s/%s.o" % (ctx.label.name, _stem(src)))
        args = ctx.actions.args()
        args.add("-x", "cu")
        args.add("-c", src)
        args.add("-o", obj)
        args.add("-ccbin", cc_toolchain.compiler_executable)

        # Intermediate files next to the object: nvcc names /tmp files by PID, which
        # collide between sandboxes.
        args.add("-objtemp")
        args.add_all(gencode)
        args.add("-Xcompiler=-fPIC")
        args.add_all(mode_flags)
        args.add_all(iquote_dirs, format_each = "-I%s")
        args.add_all(deps_ctx.includes, format_each = "-I%s")
        args.add_all(include_dirs, format_each = "-I%s")
        args.add_all(deps_ctx.system_includes, before_each = "-isystem")
        args.add_all(deps_ctx.defines, format_each = "-D%s")
        args.add_all(ctx.attr.defines, format_each = "-D%s")
        args.add_all(ctx.attr._host_copts[CudaFlagInfo].value + ctx.attr.host_copts, format_each = "-Xcompiler=%s")
        args.add_all(ctx.attr._copts[CudaFlagInfo].value + ctx.attr.copts)
        ctx.actions.run(
            executable = ctx.file._nvcc,
            arguments = [args],
            inputs = inputs,
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)

    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = _CUDA_SRC_EXTS + _HDR_EXTS),
        "hdrs": attr.label_list(allow_files = _HDR_EXTS),
        "deps": attr.label_list(providers = [CcInfo]),
        "archs": attr.string_list(),
        "copts": attr.string_list(),
        "host_copts": attr.string_list(),
        "defines": attr.string_list(),
        "includes": attr.string_list(),
        "_archs": attr.label(default = Label("//cuda:archs")),
        "_copts": attr.label(default = Label("//cuda:copts")),
        "_host_copts": attr.label(default = Label("//cuda:host_copts")),
        "_nvcc": attr.label(default = Label("@dynamicemb_cuda//:nvcc"), allow_single_file = True, cfg = "exec"),
        "_compiler_deps": attr.label(default = Label("@dynamicemb_cuda//:compiler_deps"), cfg = "exec"),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
    fragments = ["cpp"],
)

def cuda_library(
        name,
        srcs = [],
        hdrs = [],
        deps = [],
        archs = [],
        copts = [],
        host_copts = [],
        defines = [],
        local_defines = [],
        includes = [],
        visibility = None,
        testonly = None,
        tags = None,
        **kwargs):
    """A library of CUDA sources, usable like a cc_library.

    Args:
      name: target name.
      srcs: .cu files and private headers.
      hdrs: public headers.
      deps: cc_library or cuda_library targets.
      archs: arch specs for this target only (the grammar of
        --@rules_cuda//cuda:archs); when given, the flag is ignored.
      copts: extra nvcc flags.
      host_copts: extra host compiler flags (passed with -Xcompiler).
      defines: propagated preprocessor defines.
      local_defines: defines for this library's sources only.
      includes: include directories (relative to the package), propagated.
      visibility: as usual.
      testonly: as usual.
      tags: as usual.
      **kwargs: passed to the cc_library (e.g. alwayslink, linkopts).
    """
    _cuda_objects(
        name = name + "_cuda_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        archs = archs,
        copts = copts,
        host_copts = host_copts,
        defines = defines + local_defines,
        includes = includes,
        testonly = testonly,
        tags = tags,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cuda_objs"] + [s for s in srcs if not s.endswith(tuple(_CUDA_SRC_EXTS))],
        hdrs = hdrs,
        deps = deps + [Label("//cuda:runtime")],
        defines = defines,
        # Static only, as with the real rules_cuda: a shared library of these objects
        # would not find the (static) CUDA runtime's symbols.
        linkstatic = True,
        includes = includes,
        visibility = visibility,
        testonly = testonly,
        tags = tags,
        **kwargs
    )
