"""Checks that the import tests of BUILD.bazel (DOCUMENTED) are the public Python
targets docs/building.md lists ("Targets"), each with the module the docs name
for it first. examples/bazel_consumer/test.sh runs it.

    python documented_targets.py
"""

import ast
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def documented() -> dict[str, str]:
    """target -> module of the table in docs/building.md (Python targets)."""
    text = (ROOT / "docs" / "building.md").read_text()
    section = text.split("### Targets", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    out = {}
    for target, what in re.findall(r"^\| `(//dynamicemb[^`]*)` \| (.*) \|$", section, re.M):
        if target.endswith(".so"):
            continue
        module = re.search(r"`(?:import )?(dynamicemb[\w.]*)`", what).group(1)
        out["@dynamicemb" + target] = module
    return out


def built() -> dict[str, str]:
    """DOCUMENTED of BUILD.bazel."""
    tree = ast.parse((HERE / "BUILD.bazel").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTED":
            return ast.literal_eval(node.value)
    raise ValueError("BUILD.bazel has no DOCUMENTED")


def main() -> int:
    want, got = documented(), built()
    if want != got:
        print(f"documented_targets: docs/building.md lists {want}, BUILD.bazel tests {got}")
        return 1
    print(f"documented_targets: {len(got)} targets, each imports its documented module")
    return 0


if __name__ == "__main__":
    sys.exit(main())
