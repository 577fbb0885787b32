"""MODULE.bazel (Bzlmod) and WORKSPACE (Bazel 4's offline stand-ins) provide the same
repositories to the same BUILD files, checked from the sources alone (run by
tools/lint.sh; Bazel 6 and later are not on every machine, so Bzlmod is not built here).

1. Every repository a BUILD or .bzl file of dynamicemb's own names (``@name//``; the
   offline stand-ins under third_party/offline aside, which serve WORKSPACE alone) is
   provided both ways: by MODULE.bazel (a ``bazel_dep`` or a ``use_repo_rule`` name)
   and by WORKSPACE (``dynamicemb_repositories()``'s stand-ins and repositories of
   bazel/repositories.bzl, or a repository WORKSPACE itself defines).
2. Every ``bazel_dep`` of MODULE.bazel is a rule set WORKSPACE has a stand-in for, and
   every ``use_repo_rule`` repository is one ``dynamicemb_repositories()`` makes too,
   by the same rule.

    python tools/check_bzlmod.py [repository root]
"""

import pathlib
import re
import sys

BUILTIN = {"bazel_tools", "platforms", "dynamicemb"}


def referenced(root: pathlib.Path) -> dict[str, str]:
    """Repository -> a file that names it."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.name not in ("BUILD.bazel", "BUILD") and path.suffix != ".bzl":
            continue
        if rel.startswith(("third_party/offline/", "examples/", ".bazel", "bazel-", ".venv")):
            continue
        for name in re.findall(r"@([A-Za-z_][\w.-]*)//", path.read_text()):
            out.setdefault(name, rel)
    return out


def module_repos(text: str) -> tuple[set, dict]:
    deps = set(re.findall(r'bazel_dep\(\s*name\s*=\s*"([^"]+)"', text))
    rules = {}
    for var, rule in re.findall(r'(\w+)\s*=\s*use_repo_rule\(\s*"[^"]+",\s*"(\w+)"\)', text):
        for name in re.findall(rf'\b{var}\(\s*name\s*=\s*"([^"]+)"', text):
            rules[name] = rule
    return deps, rules


def workspace_repos(root: pathlib.Path) -> tuple[set, dict, set]:
    text = (root / "bazel" / "repositories.bzl").read_text()
    stand_ins = set(re.findall(r'"([\w]+)"', text.split("_STAND_INS = [", 1)[1].split("]", 1)[0]))
    made = {name: rule for rule, name in re.findall(r'maybe\((\w+),\s*name\s*=\s*"([^"]+)"', text)}
    own = set(re.findall(r'name\s*=\s*"([^"]+)"', (root / "WORKSPACE").read_text()))
    return stand_ins, made, own


def errors(root: pathlib.Path) -> list[str]:
    deps, rules = module_repos((root / "MODULE.bazel").read_text())
    stand_ins, made, own = workspace_repos(root)
    out = []
    for name, where in sorted(referenced(root).items()):
        if name in BUILTIN:
            continue
        if name not in deps and name not in rules:
            out.append(f"{where} names @{name}, which MODULE.bazel does not provide")
        if name not in stand_ins and name not in made and name not in own:
            out.append(f"{where} names @{name}, which WORKSPACE does not provide")
    for name in sorted(deps):
        if name not in stand_ins and name not in own:
            out.append(f"MODULE.bazel's bazel_dep {name} has no WORKSPACE stand-in")
    for name, rule in sorted(rules.items()):
        if made.get(name) != rule:
            out.append(
                f"MODULE.bazel makes @{name} with {rule}, dynamicemb_repositories() with "
                f"{made.get(name)}"
            )
    return out


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).parents[1])
    found = errors(root.resolve())
    for e in found:
        print(f"check_bzlmod: {e}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
