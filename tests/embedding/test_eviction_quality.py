"""The eviction-quality benchmark (tools/bench/eviction_quality.py) at a tiny
size: it runs, and its figures are what the protocols make them: rates in
[0, 1], no strategy above the oracle, LFU above the random baseline on Zipf
keys, an LFU table that lets colder newcomers in losing resident keys and one
that refuses them (or admission that rejects them) losing none."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("quality") / "figures.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    cmd = [
        sys.executable,
        os.path.join(ROOT, "tools", "bench", "eviction_quality.py"),
        *("--device", "cpu", "--scale", "4096", "--json", out),
        *("--protocols", "cache", "admission", "job", "--job-steps", "30"),
        *("--strategies", "step", "lfu", "random", "--no-optimizers"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out) as f:
        rows = json.load(f)["rows"]
    return {(r["protocol"], r["option"]): r for r in rows}


def test_every_rate_is_a_share(figures):
    for key, r in figures.items():
        for name, v in r.items():
            if name.startswith(("hit_rate", "eval_auc")) and v is not None:
                assert 0.0 <= v <= 1.0, (key, name, v)


def test_lfu_beats_random_eviction_and_no_strategy_beats_the_oracle(figures):
    cache = {o: r for (p, o), r in figures.items() if p == "cache"}
    oracle = cache["oracle"]["hit_rate"]
    for option, r in cache.items():
        assert r["hit_rate"] <= oracle + 0.01, (option, r["hit_rate"], oracle)
    assert cache["lfu"]["hit_rate"] > cache["random"]["hit_rate"] + 0.02
    # Admission keeps keys seen once out: fewer evictions, rejections counted.
    assert cache["lfu +admission"]["rejections"] > 0
    assert cache["lfu +admission"]["evictions"] < cache["lfu"]["evictions"]


def test_refusing_colder_newcomers_keeps_the_resident_keys(figures):
    adm = {o: r for (p, o), r in figures.items() if p == "admission"}
    assert adm["lfu"]["load"] >= 0.95
    assert adm["lfu"]["loss_points"] > 5.0, adm["lfu"]
    assert adm["lfu +refuse_cold"]["loss_points"] == 0.0
    assert adm["lfu +refuse_cold"]["refusals"] > 0
    assert adm["lfu +admission"]["loss_points"] == 0.0
    # A STEP newcomer is never colder: it displaces residents either way.
    assert adm["step"]["loss_points"] > 5.0


def test_the_main_job_runs_once_per_option(figures):
    job = {o: r for (p, o), r in figures.items() if p == "job"}
    assert set(job) >= {"step", "lfu", "lfu +admission", "lfu +refuse_cold"}
    for r in job.values():
        assert 0.0 <= r["hit_rate_t_user"] <= 1.0
    assert job["lfu +admission"]["hit_rate_t_item"] != job["lfu"]["hit_rate_t_item"]
