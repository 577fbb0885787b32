"""Without OpenTelemetry, ``import dynamicemb.metrics`` and ``serve_prometheus``
fail with an ImportError that names the extra to install."""

import os
import subprocess
import sys
from pathlib import Path

import dynamicemb

# The folder of the dynamicemb this test imports, the one with the built
# extension beside it (under Bazel, the runfiles tree: its files are links into
# the source tree, which has no extension, so the path is not resolved).
ROOT = Path(dynamicemb.__file__).parent.parent

SCRIPT = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # the package is not installed
try:
    {call}
except ImportError as e:
    print("IMPORTERROR", e)
"""


def _run(blocked, call):
    script = SCRIPT.format(blocked=blocked, call=call)
    ran = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stdout


def test_metrics_without_opentelemetry_names_the_extra():
    out = _run(["opentelemetry", "opentelemetry.metrics"], "import dynamicemb.metrics")
    assert "IMPORTERROR dynamicemb.metrics needs OpenTelemetry's API" in out, out
    assert "dynamicemb[opentelemetry]" in out and "dynamicemb[prometheus]" in out


def test_serve_prometheus_without_the_sdk_names_the_extra():
    call = "from dynamicemb.metrics import serve_prometheus; serve_prometheus(0)"
    out = _run(["opentelemetry.sdk", "opentelemetry.sdk.metrics"], call)
    assert "IMPORTERROR serve_prometheus needs opentelemetry-sdk" in out, out
    assert "dynamicemb[prometheus]" in out
