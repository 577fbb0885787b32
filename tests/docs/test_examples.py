"""Each entry point of the API reference carries an example (an ``Example::``
block in its docstring) that is valid Python whose imports resolve: the
options, the planner, the sharders, checkpoints, incremental dumps and
replays, metrics and the inference table."""

import ast
import importlib
import inspect
import textwrap

import pytest

ENTRY_POINTS = [
    ("dynamicemb", "DynamicEmbTableOptions"),
    ("dynamicemb.planner", "DynamicEmbeddingShardingPlanner"),
    ("dynamicemb.planner", "topology"),
    ("dynamicemb.shard", "DynamicEmbeddingCollectionSharder"),
    ("dynamicemb.shard", "DynamicEmbeddingBagCollectionSharder"),
    ("dynamicemb.shard", "plan_and_shard"),
    ("dynamicemb", "DynamicEmbDump"),
    ("dynamicemb", "DynamicEmbLoad"),
    ("dynamicemb.incremental_dump", "incremental_dump"),
    ("dynamicemb.incremental_dump", "replay_increment"),
    ("dynamicemb.replication", "replay_by_key"),
    ("dynamicemb.replication", "DeltaPublisher"),
    ("dynamicemb.metrics", "instrument"),
    ("dynamicemb.metrics", "serve_prometheus"),
    ("dynamicemb", "InferenceEmbeddingTable"),
]


def example(doc: str) -> str:
    """The indented block after ``Example::`` in a docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Example::") + 1
    block = []
    for line in lines[start:]:
        if line.strip() and not line.startswith(" "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip()


@pytest.mark.parametrize("module,name", ENTRY_POINTS, ids=[n for _, n in ENTRY_POINTS])
def test_the_entry_point_has_an_example_that_parses_and_imports(module, name):
    obj = getattr(importlib.import_module(module), name)
    doc = obj.__doc__ or ""
    assert "Example::" in doc, f"{module}.{name} has no example"
    code = example(doc)
    assert code.count("\n") >= 1, f"{module}.{name}: an empty example"
    tree = ast.parse(code, filename=f"{module}.{name} example")
    # Every name an example imports exists under that import path.
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported = importlib.import_module(node.module)
            for alias in node.names:
                where = f"{name}'s example: {node.module}.{alias.name}"
                assert hasattr(imported, alias.name), where
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


def test_example_takes_the_block_and_nothing_after_it():
    doc = """Summary.

    Example::

        a = 1
        b = a

    Notes: after.
    """
    assert example(doc) == "a = 1\nb = a"
    with pytest.raises(StopIteration):
        example("No example here.")
