"""The API reference in docs/api is the public contract and says so itself;
nothing the repository ships cites a specification file it does not contain."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _shipped_text_files():
    """The repository's files (git's list where there is a checkout, else the
    docs, sources and tests beside this file)."""
    try:
        names = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        files = [ROOT / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        files = [p for d in ("docs", "dynamicemb", "tests", "tools") for p in (ROOT / d).rglob("*")]
        files += [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    suffixes = {".md", ".rst", ".py", ".txt", ".toml", ".bazel", ".bzl", ".sh"}
    return [f for f in files if f.suffix in suffixes and f.is_file()]


def test_the_reference_says_it_is_the_contract():
    index = (ROOT / "docs" / "api" / "index.rst").read_text()
    assert "it is the public\ncontract" in index
    assert (ROOT / "docs" / "api" / "spec_imports.txt").is_file()


@pytest.mark.parametrize("cited", ["DynamicEmb_APIs.md"])
def test_no_file_cites_a_specification_the_repository_lacks(cited):
    files = _shipped_text_files()
    assert cited not in [f.name for f in files]  # the repository does not hold it
    here = Path(__file__).resolve()  # names it to keep it out
    citing = [str(f) for f in files if f.resolve() != here and cited in f.read_text()]
    assert citing == [], citing
