"""setup.py's two ways to the extension: compiling the sources of cc/sources.bzl
(a wheel built anywhere, and the GPU machine's build: tools/run_gpu_tests.sh) and
packaging one built already (DEMB_PREBUILT_EXTENSION: tools/test.sh's packaging
check gives it Bazel's //dynamicemb:_C.so, so the extension is compiled once)."""

import os
import subprocess
import sys

import pytest

from tests.packaging.repo_files import repo_root, setup_py_names, tool

PREBUILT = "DEMB_PREBUILT_EXTENSION"


def _sources_bzl():
    names = {}
    path = repo_root() / "cc" / "sources.bzl"
    exec(compile(path.read_text(), str(path), "exec"), names)
    return names["PACKAGES"]


def _extension(monkeypatch, prebuilt=None):
    """setup.py's extension and build_ext for a CPU build, without running setup()."""
    monkeypatch.setenv("DEMB_BUILD_CUDA", "0")
    monkeypatch.delenv("DEMB_STRIP", raising=False)
    if prebuilt is None:
        monkeypatch.delenv(PREBUILT, raising=False)
    else:
        monkeypatch.setenv(PREBUILT, prebuilt)
    monkeypatch.chdir(repo_root())  # setup.py's source paths are relative to it
    (ext,), build_ext, _ = setup_py_names()["extension_modules"]()
    return ext, build_ext


def _expected_files(kind):
    return sorted(f"{pkg}/{f}" for pkg, files in _sources_bzl().items() for f in files[kind])


def test_the_compiled_extension_is_every_cpu_source_of_sources_bzl(monkeypatch):
    from torch.utils import cpp_extension

    ext, build_ext = _extension(monkeypatch)
    assert ext.name == "dynamicemb._C"
    assert sorted(ext.sources) == _expected_files("cpu_srcs")
    assert sorted(ext.depends) == sorted(_expected_files("hdrs") + ["cc/sources.bzl"])
    assert build_ext is cpp_extension.BuildExtension  # compiles
    cxx = ext.extra_compile_args["cxx"]
    assert "-O3" in cxx and "-Wall" in cxx and "-Wextra" in cxx
    assert "-Wl,--strip-all" in ext.extra_link_args
    assert "-g0" in cxx  # no debug info for the stripped link to drop


def test_a_prebuilt_extension_keeps_the_sources_and_is_copied_stripped(monkeypatch, tmp_path):
    from dynamicemb.table._native import extension

    built = os.path.realpath(extension().__file__)
    ext, build_ext = _extension(monkeypatch, prebuilt=built)
    # The sdist made beside it carries the same sources.
    assert sorted(ext.sources) == _expected_files("cpu_srcs")
    assert build_ext.__name__ == "PackagePrebuilt"

    lib, temp = tmp_path / "lib", tmp_path / "temp"
    env = dict(os.environ, DEMB_BUILD_CUDA="0", **{PREBUILT: built})
    env.pop("DEMB_STRIP", None)
    ran = subprocess.run(
        [sys.executable, str(repo_root() / "setup.py"), "-q", "build_ext", "-b", lib, "-t", temp],
        capture_output=True,
        text=True,
        env=env,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (copied,) = (lib / "dynamicemb").glob("_C*.so")
    sections = tool("check_dist").elf_section_names(copied)
    assert ".symtab" not in sections and not [s for s in sections if s.startswith(".debug")]
    assert ".dynsym" in sections
    assert not list(temp.glob("**/*.o"))  # nothing compiled
    # The copy loads as the module it is (its torch ops and pybind11 functions).
    probe = (
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('dynamicemb._C', {str(copied)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(int(module.cuda_built()))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[-1] in ("0", "1")


@pytest.mark.parametrize(
    "value, says",
    [
        ("relative/_C.so", "is not an absolute path"),
        ("/nonexistent/dynamicemb/_C.so", "is not a file"),
        (None, "is not a shared library (ELF)"),  # setup.py itself, a text file
    ],
)
def test_a_bad_prebuilt_extension_is_refused_naming_it(monkeypatch, value, says):
    value = value or str(repo_root() / "setup.py")
    monkeypatch.setenv(PREBUILT, value)
    with pytest.raises(SystemExit) as exit_:
        setup_py_names()["prebuilt_extension"]()
    assert f"{PREBUILT}={value!r} {says}" in str(exit_.value)
