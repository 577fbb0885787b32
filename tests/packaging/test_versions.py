"""One version string: dynamicemb.__version__, which the wheel's metadata reads
(pyproject.toml) and MODULE.bazel, CHANGELOG.md and the Bzlmod snippet of
docs/building.md repeat; the versions tools/setup_env.sh installs are a pair
setup.py's extras were tested with."""

import re

import tomllib

import dynamicemb
from tests.packaging.repo_files import repo_root, setup_py_names


def _read(rel: str) -> str:
    return (repo_root() / rel).read_text()


def test_the_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", dynamicemb.__version__), dynamicemb.__version__


def test_the_wheel_reads_the_packages_version():
    project = tomllib.loads(_read("pyproject.toml"))
    assert "version" in project["project"]["dynamic"]
    assert "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dynamicemb.__version__"}


def test_module_bazel_changelog_and_docs_carry_the_same_version():
    call = re.search(r"^module\((.*?)^\)", _read("MODULE.bazel"), re.M | re.S)
    module = call and re.search(r'^\s*version = "([^"]+)"', call.group(1), re.M)
    assert module and module.group(1) == dynamicemb.__version__
    headings = re.findall(r"^## (\d+\.\d+\.\d+)\b", _read("CHANGELOG.md"), re.M)
    assert headings and headings[0] == dynamicemb.__version__, headings
    deps = re.findall(
        r'bazel_dep\(name = "dynamicemb", version = "([^"]+)"\)', _read("docs/building.md")
    )
    assert deps and set(deps) == {dynamicemb.__version__}, deps


def test_setup_env_installs_a_tested_pair():
    text = _read("tools/setup_env.sh")
    pins = dict(re.findall(r"^(TORCH|FBGEMM|TORCHREC)=[\w-]+==([\d.]+)$", text, re.M))
    assert set(pins) == {"TORCH", "FBGEMM", "TORCHREC"}, pins
    release = ".".join(pins["TORCH"].split(".")[:2])
    assert (release, pins["TORCHREC"], pins["FBGEMM"]) in setup_py_names()["TESTED_WITH"]


def test_the_newest_smoke_job_runs_the_newest_tested_set():
    text = _read("tools/newest_smoke.sh")
    pins = dict(re.findall(r"^(TORCH|FBGEMM|TORCHREC)=[\w-]+==([\d.]+)$", text, re.M))
    release = ".".join(pins["TORCH"].split(".")[:2])
    assert (release, pins["TORCHREC"], pins["FBGEMM"]) == setup_py_names()["TESTED_WITH"][-1]
    assert "bash tools/newest_smoke.sh" in _read("tools/test.sh")


def _torch(version):
    return type("torch", (), {"__version__": version})


def test_wheel_extras_pin_the_tested_pair_and_the_sdist_the_range():
    names = setup_py_names()
    tested = names["TESTED_WITH"]
    for release, torchrec, fbgemm in tested:
        wheel = names["extras"](_torch(release + ".0+cu130"), for_sdist=False)
        assert wheel["torchrec-cuda"] == [f"torchrec=={torchrec}", f"fbgemm-gpu=={fbgemm}"]
        assert wheel["fbgemm-cpu"] == [f"fbgemm-gpu-cpu=={fbgemm}"]
        # The CPU extra never names torchrec (whose metadata requires the CUDA fbgemm-gpu).
        assert wheel["torchrec-cpu-deps"][0] == f"fbgemm-gpu-cpu=={fbgemm}"
        assert not any(r.startswith("torchrec") for r in wheel["torchrec-cpu-deps"])
    (_, rec_lo, fb_lo), (_, rec_hi, fb_hi) = tested[0], tested[-1]
    ranges = [f"torchrec>={rec_lo},<={rec_hi}", f"fbgemm-gpu>={fb_lo},<={fb_hi}"]
    sdist = names["extras"](_torch(tested[-1][0] + ".0"), for_sdist=True)
    assert sdist["torchrec-cuda"] == ranges
    # A wheel for a torch release nobody tested gets the range too.
    assert names["extras"](_torch("9.99.0"), for_sdist=False)["torchrec-cuda"] == ranges


def test_each_extra_named_after_a_package_installs_it():
    """An extra named after a distribution (torchrec-cuda, fbgemm-cpu, numba, ...)
    installs it; one that installs a package's requirements only says so (-deps)."""
    names = setup_py_names()
    release = names["TESTED_WITH"][-1][0]
    for for_sdist in (False, True):
        for extra, requires in names["extras"](_torch(release + ".0"), for_sdist).items():
            package = extra.split("-")[0]
            if package not in ("torchrec", "fbgemm", "numba", "opentelemetry") or extra.endswith(
                "-deps"
            ):
                continue
            assert any(r.startswith(package) for r in requires), (extra, requires)
