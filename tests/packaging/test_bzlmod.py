"""tools/check_bzlmod.py (run by tools/lint.sh on the checkout) finds a repository
that MODULE.bazel and WORKSPACE do not both provide, on small trees of their files."""

import textwrap

from tests.packaging.repo_files import tool


def _tool():
    return tool("check_bzlmod")


def _tree(root, module_bazel, stand_ins=("rules_cc", "rules_python"), build='"@rules_cc//x"'):
    (root / "bazel").mkdir()
    (root / "bazel" / "repositories.bzl").write_text(
        "_STAND_INS = [" + ", ".join(f'"{s}"' for s in stand_ins) + "]\n"
        'def dynamicemb_repositories():\n    maybe(local_torch, name = "dynamicemb_torch")\n'
    )
    (root / "WORKSPACE").write_text('workspace(name = "dynamicemb")\n')
    (root / "MODULE.bazel").write_text(textwrap.dedent(module_bazel))
    (root / "pkg").mkdir()
    (root / "pkg" / "BUILD.bazel").write_text(f'deps = [{build}, "@dynamicemb_torch//:t"]\n')


MODULE = """
    bazel_dep(name = "rules_cc", version = "1")
    local_torch = use_repo_rule("//bazel:local_python.bzl", "local_torch")
    local_torch(name = "dynamicemb_torch")
"""


def test_a_tree_in_step_passes(tmp_path):
    _tree(tmp_path, MODULE)
    assert _tool().errors(tmp_path) == []


def test_a_repository_missing_on_either_side_is_named(tmp_path):
    _tree(tmp_path, MODULE, build='"@rules_cuda//y"')
    found = _tool().errors(tmp_path)
    assert any("@rules_cuda, which MODULE.bazel does not provide" in e for e in found), found
    assert any("@rules_cuda, which WORKSPACE does not provide" in e for e in found), found


def test_a_bazel_dep_without_stand_in_is_named(tmp_path):
    _tree(tmp_path, MODULE + 'bazel_dep(name = "rules_java", version = "2")\n')
    want = "MODULE.bazel's bazel_dep rules_java has no WORKSPACE stand-in"
    assert _tool().errors(tmp_path) == [want]
