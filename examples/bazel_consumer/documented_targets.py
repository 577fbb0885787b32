"""Checks that the import tests of BUILD.bazel (DOCUMENTED) are the public Python
targets docs/building.md lists ("Targets"), each with the module the docs name
for it first; that every Python target README.md and docs/ name anywhere is one
of them; and that where a page names a module's target ("`module` (Bazel:
`target`"), DOCUMENTED imports that module through that target.
examples/bazel_consumer/test.sh runs it.

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


def pages() -> dict[str, str]:
    """README.md and the Markdown pages of docs/: name -> text."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(f.relative_to(ROOT)): f.read_text() for f in files}


def named(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The Python targets a page names (as @dynamicemb//...), and its
    (target, module) pairs written "`module` (Bazel: `target`"."""
    targets = set()
    for target in re.findall(r"(?:@dynamicemb)?(//dynamicemb[\w/]*(?::[\w.]+)?)", text):
        if not target.endswith(".so") and ":__" not in target:
            targets.add("@dynamicemb" + target)
    pairs = {
        ("@dynamicemb" + target, module)
        for module, target in re.findall(
            r"`(dynamicemb[\w.]*)`\s+\(Bazel:\s+`(//dynamicemb[\w/:]*)`", text
        )
    }
    return targets, pairs


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
    status = 0
    for page, text in pages().items():
        targets, pairs = named(text)
        for target in sorted(targets - set(got)):
            print(f"documented_targets: {page} names {target}, which no import test covers")
            status = 1
        for target, module in sorted(pairs - set(got.items())):
            print(
                f"documented_targets: {page} names {target} for {module}, "
                f"but BUILD.bazel imports {got.get(target)} through it"
            )
            status = 1
    if status:
        return status
    print(f"documented_targets: {len(got)} targets, each imports its documented module")
    return 0


if __name__ == "__main__":
    sys.exit(main())
