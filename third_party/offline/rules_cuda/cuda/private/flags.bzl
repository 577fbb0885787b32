"""Build settings of the rules_cuda stand-in."""

CudaArchsInfo = provider(
    doc = "Parsed --@rules_cuda//cuda:archs.",
    fields = {
        "gencode": "list of (virtual arch, list of codes), e.g. [('compute_90', ['sm_90'])]",
    },
)

CudaFlagInfo = provider(
    doc = "Value of a string-list flag.",
    fields = {"value": "list of strings"},
)

def _virtual_of(arch):
    # sm_90a -> compute_90a, compute_80 -> compute_80
    if arch.startswith("sm_"):
        return "compute_" + arch[len("sm_"):]
    if arch.startswith("compute_"):
        return arch
    fail("cannot parse CUDA arch '%s' (want sm_XX or compute_XX)" % arch)

def parse_archs(value):
    """Parses the archs grammar of rules_cuda.

    `spec[;spec...]`, where spec is `virtual:code[,code...]` or `code[,code...]`;
    a code is `sm_XX` (SASS) or `compute_XX` (PTX). Without a virtual arch, each
    code gets the virtual arch of the same number.

    Args:
      value: the archs string, e.g. "compute_80:sm_80;sm_90".

    Returns:
      The list of nvcc -gencode flags.
    """
    gencode = []
    for spec in value.replace(" ", "").split(";"):
        if not spec:
            continue
        if ":" in spec:
            virtual, codes = spec.split(":", 1)
            if not virtual.startswith("compute_"):
                fail("virtual arch must be compute_XX, got '%s'" % virtual)
            gencode.append((virtual, [c for c in codes.split(",") if c]))
        else:
            for code in spec.split(","):
                if code:
                    gencode.append((_virtual_of(code), [code]))
    return gencode

def _cuda_archs_flag_impl(ctx):
    return CudaArchsInfo(gencode = parse_archs(ctx.build_setting_value))

cuda_archs_flag = rule(
    implementation = _cuda_archs_flag_impl,
    build_setting = config.string(flag = True),
)

def _repeatable_string_flag_impl(ctx):
    return CudaFlagInfo(value = [v for v in ctx.build_setting_value if v])

repeatable_string_flag = rule(
    implementation = _repeatable_string_flag_impl,
    build_setting = config.string_list(flag = True),
)
