"""The torch ops' rules, checked from the sources alone (run by tools/lint.sh;
no build, no torch):

1. Every op whose schema ``cc/ops/schemas.cpp`` defines (``m.def("name(...``)
   has a kernel on every backend: an ``m.impl("name", ...)`` in a
   ``TORCH_LIBRARY_IMPL(dynamicemb, <key>, m)`` block for each of ``BACKENDS``
   (the files of cc/ops), and no block registers an op without a schema.
2. Every op is checked by ``torch.library.opcheck``: its ``<ops>.name.default``
   is named in a test file under tests/ that calls ``opcheck`` (the tests
   run it on the CPU, and on CUDA where a device is).

    python tools/check_ops.py [repository root]
"""

import pathlib
import re
import sys

BACKENDS = ("CPU", "CUDA", "Meta")
_DEF = re.compile(r'm\.def\(\s*"(\w+)\(')
_IMPL_BLOCK = re.compile(r"TORCH_LIBRARY_IMPL\(\s*dynamicemb\s*,\s*(\w+)\s*,\s*m\s*\)\s*\{")
_IMPL = re.compile(r'm\.impl\(\s*"(\w+)"')
_DEFAULT = re.compile(r"\.(\w+)\.default\b")


def schemas(root: pathlib.Path) -> list[str]:
    """The ops cc/ops/schemas.cpp defines, in order."""
    return _DEF.findall((root / "cc" / "ops" / "schemas.cpp").read_text())


def _block(text: str, start: int) -> str:
    """The text between the brace at ``start`` and its match."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    raise ValueError(f"unbalanced braces after offset {start}")


def kernels(root: pathlib.Path) -> dict[str, set[str]]:
    """The ops each dispatch key registers a kernel of, over cc/ops."""
    out: dict[str, set[str]] = {}
    for path in sorted((root / "cc" / "ops").glob("*.cpp")):
        text = path.read_text()
        for m in _IMPL_BLOCK.finditer(text):
            ops = _IMPL.findall(_block(text, m.end() - 1))
            out.setdefault(m.group(1), set()).update(ops)
    return out


def opchecked(root: pathlib.Path) -> set[str]:
    """The names ``.name.default`` in the test files that call opcheck."""
    out: set[str] = set()
    for path in sorted((root / "tests").rglob("*.py")):
        text = path.read_text()
        if "opcheck(" in text:
            out.update(_DEFAULT.findall(text))
    return out


def check(root: pathlib.Path) -> list[str]:
    errors = []
    defined = schemas(root)
    if not defined:
        return ["cc/ops/schemas.cpp: no m.def found"]
    registered = kernels(root)
    for key in BACKENDS:
        have = registered.get(key, set())
        for op in defined:
            if op not in have:
                errors.append(f"op {op}: no {key} kernel (m.impl in a {key} block of cc/ops)")
        for op in sorted(have - set(defined)):
            errors.append(f"op {op}: a {key} kernel but no schema in cc/ops/schemas.cpp")
    checked = opchecked(root)
    for op in defined:
        if op not in checked:
            errors.append(f"op {op}: no test under tests/ runs torch.library.opcheck on it")
    return errors


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).parent.parent)
    errors = check(root.resolve())
    for e in errors:
        print(f"check_ops: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
