"""Every command the code blocks of README.md and docs/training.md show works as
written after the README's set-up (a checkout with the extension built, nothing
on PYTHONPATH), or is listed in ELSEWHERE with the reason it cannot run on one
CPU machine and where it is checked instead. A command added to those pages
fails the first test until it is in one list or the other."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.packaging.repo_files import checkout_with_extension, repo_root

# Each page, and whether its indented blocks are commands too.
PAGES = {"README.md": True, "docs/training.md": False}

# The pages' placeholder folders, as folders of this test's tmp_path.
PLACES = {"/shared/ckpt": "ckpt", "/tmp/clicks": "clicks"}

CAPACITY = (
    'python -c "import dynamicemb, dynamicemb.table as t; '
    'print(t.ScoredHashTable([1024]).capacity())"'
)
CKPT = "--checkpoint-dir /shared/ckpt --checkpoint-every 100 --keep 3"
FIRST = f"python examples/train_dlrm.py --steps 200 {CKPT}"
RESUME = f"python examples/train_dlrm.py --steps 400 {CKPT} --resume"
FILES = "python examples/make_sample_data.py --out /tmp/clicks --rows 40000 --gzip"
TRAIN_FILES = (
    "python examples/train_dlrm.py --data /tmp/clicks/train --eval-data /tmp/clicks/eval "
    "--steps 150 --batch-size 128 --table-capacity 16384"
)
REPLICA = "python examples/serve_replica.py demo --steps 60"

# Run as written, in this order (a resume after the run it resumes, training on
# files after the files are written).
RUN = [CAPACITY, FIRST, RESUME, FILES, TRAIN_FILES, REPLICA]

_MAIN_JOB = "tests/main_job"
ELSEWHERE = {
    "bash tools/test.sh": "the whole suite, which CI runs (this test is part of it)",
    "bash tools/main.sh": "installs apt packages as root; tests/packaging/test_main_sh.py "
    "checks its steps, the main job's tests the job",
    "torchrun --standalone --nproc-per-node 8 examples/train_dlrm.py": "one rank per GPU of an "
    f"8-GPU node; {_MAIN_JOB}/test_torchrun.py runs it under torchrun at 2 and 4 ranks",
    "torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 "
    "--rdzv-id dlrm examples/train_dlrm.py": f"four nodes; {_MAIN_JOB}/test_torchrun.py runs "
    "two agents at a c10d rendezvous on this machine",
    "torchrun --standalone --nproc-per-node 8 --max-restarts 3 examples/train_dlrm.py "
    "--checkpoint-dir /shared/ckpt --checkpoint-every 500 --resume": "an 8-GPU node; "
    f"{_MAIN_JOB}/test_resume.py runs --max-restarts and --resume under torchrun",
    "python examples/train_dlrm.py --preset criteo --interaction dcn --emb-budget-gib 24": "24 "
    f"GiB of rows on a GPU; {_MAIN_JOB}/test_criteo_preset.py runs the preset at a tiny size",
    "pip install fsspec s3fs": "installs into the environment (tools/setup_env.sh has both)",
    "python examples/train_dlrm.py --checkpoint-dir s3://bucket/runs/dlrm --checkpoint-every 500 "
    "--resume": f"a bucket; {_MAIN_JOB}/test_job_s3.py runs it against an S3 server (moto)",
    "python examples/train_dlrm.py --warm-start /models/static_dlrm.pt --checkpoint-dir "
    "/shared/ckpt": f"a team's TorchRec model; {_MAIN_JOB}/test_warm_start_job.py writes one "
    "and starts from it",
    "pip install --no-build-isolation -e .": "installs into the environment; tools/check_dist.py "
    "--fresh-venv installs the wheel in a new venv",
    "git checkout <tag> && pip install build && python -m build --no-isolation": "a tag of a "
    "clone; tools/check_dist.py --fresh-venv builds the wheel so",
    "pip install torch==X dist/dynamicemb-<version>-*.whl": "tools/check_dist.py --fresh-venv",
    'local_repository(name = "dynamicemb", path = "/path/to/dynamicemb")': "Starlark for a "
    "WORKSPACE: examples/bazel_consumer/test.sh",
    'load("@dynamicemb//bazel:repositories.bzl", "dynamicemb_repositories")': "the same",
    "dynamicemb_repositories()": "the same",
    "#!/bin/bash": "the SLURM script's lines: a cluster",
    "#SBATCH --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 --cpus-per-task=32": "the same",
    'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)': "the same",
    'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --rdzv-backend c10d '
    '--rdzv-endpoint "$head:29500" --rdzv-id "$SLURM_JOB_ID" --max-restarts 3 '
    "examples/train_dlrm.py --steps 100000 --batch-size 4096 --checkpoint-dir /shared/ckpt/dlrm "
    "--checkpoint-every 1000 --keep 3 --resume "
    "--summary-json /shared/ckpt/dlrm/summary.json": "the same",
    "torchx run -s kubernetes -cfg queue=default dist.ddp -j 4x8 --gpu 8 --max_retries 3 "
    "--mounts type=volume,src=dlrm-ckpt,dst=/ckpt --script examples/train_dlrm.py -- "
    "--checkpoint-dir /ckpt --checkpoint-every 1000 --resume": "a Kubernetes cluster",
}


def _blocks(text: str, indented: bool) -> list[list[str]]:
    """The code blocks of a Markdown page: fenced as bash or sh, and with
    `indented`, indented by four spaces after a blank line (README.md writes
    its commands so; docs/training.md indents formulas)."""
    blocks, block, fence, prev_blank = [], None, None, True
    for line in text.splitlines():
        if fence is not None:
            if line.startswith("```"):
                if fence:
                    blocks.append(block)
                fence, block = None, None
            elif fence:
                block.append(line)
            continue
        if line.startswith("```"):
            if block is not None:
                blocks.append(block)
            fence, block = bool(re.match(r"```(bash|sh)\s*$", line)), []
        elif indented and line.startswith("    ") and (block is not None or prev_blank):
            block = (block or []) + [line[4:]]
        else:
            if block is not None:
                blocks.append(block)
            block = None
        prev_blank = not line.strip()
    if block is not None:
        blocks.append(block)
    return blocks


def commands(text: str, indented: bool = True) -> list[str]:
    """The commands of a page's code blocks: continued lines joined, a
    trailing comment dropped, blank lines skipped."""
    out = []
    for block in _blocks(text, indented):
        joined = re.sub(r"\\\n\s*", "", "\n".join(block))
        for line in joined.splitlines():
            line = line.strip()
            if not line.startswith("#!") and not line.startswith("#SBATCH"):
                line = re.sub(r"\s+#\s.*$", "", line)
            if line:
                out.append(re.sub(r"\s+", " ", line))
    return out


def test_every_command_of_the_pages_is_run_here_or_placed_elsewhere():
    shown = []
    for page, indented in PAGES.items():
        shown += commands((repo_root() / page).read_text(), indented)
    assert len(shown) >= 20, shown
    unplaced = sorted({c for c in shown if c not in RUN and c not in ELSEWHERE})
    assert unplaced == [], "commands the docs show that no test runs"
    stale = sorted(set(RUN + list(ELSEWHERE)) - set(shown))
    assert stale == [], "listed commands the docs no longer show"


def test_commands_joins_continuations_and_drops_comments():
    text = "x\n\n    a --b \\\n        c   # why\n    d\n\n```bash\ne \\\n  f\n```\n"
    assert commands(text) == ["a --b c", "d", "e f"]
    assert commands(text, indented=False) == ["e f"]
    assert commands("```\n    not a command\n```\n\n    b\n") == ["b"]


def _run(command: str, checkout: Path, tmp: Path) -> str:
    argv = shlex.split(command)
    assert argv[0] == "python", command
    for place, folder in PLACES.items():
        argv = [a.replace(place, str(tmp / folder)) for a in argv]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    ran = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert ran.returncode == 0, f"{command}\n{ran.stdout[-4000:]}"
    return ran.stdout


def test_the_commands_run_as_written(tmp_path):
    checkout = checkout_with_extension(tmp_path / "checkout")
    said = {command: _run(command, checkout, tmp_path) for command in RUN}
    assert said[CAPACITY].strip().splitlines()[-1].isdigit(), said[CAPACITY]
    # Checkpoints after steps 100 and 200, then 300 and 400: the three newest remain.
    steps = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step_"))
    assert steps == ["step_00000200", "step_00000300", "step_00000400"], steps
    assert "resumed from" in said[RESUME] and "after step 200" in said[RESUME], said[RESUME]
    assert "dynamic tables (summed over ranks)" in said[TRAIN_FILES]
