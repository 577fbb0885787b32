"""dynamicemb_repositories(): everything a WORKSPACE needs to build @dynamicemb targets.

In the WORKSPACE of a workspace that uses dynamicemb (Bazel 4.2 and later, WORKSPACE
mode; Bzlmod users see MODULE.bazel and docs/building.md):

    local_repository(name = "dynamicemb", path = "/path/to/dynamicemb")  # or http_archive
    load("@dynamicemb//bazel:repositories.bzl", "dynamicemb_repositories")
    dynamicemb_repositories()

Every repository below is created only if the workspace has none of that name when the
macro runs: declare your own before the call to keep it.

  rules_cc, rules_python, rules_cuda
      what dynamicemb's BUILD files load; offline stand-ins from
      @dynamicemb//third_party/offline that forward to Bazel's native rules (rules_cuda:
      a compile-only nvcc rule with the real one's labels, flags and `archs` attribute)
  rules_java, remote_coverage_tools
      what Bazel 4 itself would download from GitHub (its WORKSPACE suffix); offline
      stand-ins (`bazel coverage` then says it is unavailable)
  dynamicemb_python   the interpreter: $PYTHON_BIN_PATH or .venv/bin/python of the
                      workspace; its toolchain is registered (a Python toolchain you
                      register before the call wins) so py_test runs with the torch the
                      extension is built against
  dynamicemb_torch    that interpreter's torch (headers, libraries, defs.bzl)
  dynamicemb_cuda     the CUDA toolkit for the rules_cuda stand-in: $CUDA_PATH,
                      /usr/local/cuda or the real location of nvcc

The names of dynamicemb's own repositories start with `dynamicemb_`; the rule sets keep
their usual names, so one copy serves the whole workspace.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//bazel:local_cuda.bzl", "local_cuda")
load("//bazel:local_python.bzl", "local_python_configure", "local_torch")

# Rule sets with an offline stand-in in third_party/offline/<name>.
_STAND_INS = [
    "rules_cc",
    "rules_java",
    "remote_coverage_tools",
    "rules_python",
    "rules_cuda",
]

def _stand_in_impl(rctx):
    # third_party/offline/<name> of the repository this file belongs to.
    third_party = rctx.path(Label("//third_party:BUILD.bazel")).dirname
    src = third_party.get_child("offline").get_child(rctx.attr.set)
    if not src.exists:
        fail("dynamicemb: no stand-in %s at %s" % (rctx.attr.set, src))
    for child in src.readdir():
        rctx.symlink(child, child.basename)

_stand_in = repository_rule(
    implementation = _stand_in_impl,
    attrs = {"set": attr.string(mandatory = True)},
    local = True,
)

# A WORKSPACE macro: it creates several repositories, so it takes no `name`.
# buildifier: disable=unnamed-macro
def dynamicemb_repositories(register_python_toolchain = True):
    """Creates the repositories dynamicemb needs that the workspace does not have yet.

    Args:
      register_python_toolchain: register @dynamicemb_python//:py_toolchain (after any
        Python toolchain registered before this call, which then wins).
    """
    for name in _STAND_INS:
        maybe(_stand_in, name = name, set = name)
    maybe(local_cuda, name = "dynamicemb_cuda")
    maybe(local_python_configure, name = "dynamicemb_python")
    maybe(local_torch, name = "dynamicemb_torch")
    if register_python_toolchain:
        native.register_toolchains("@dynamicemb_python//:py_toolchain")
