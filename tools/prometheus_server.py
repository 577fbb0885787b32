"""A Prometheus server of its own, for the metrics test and the metrics picture.

Starts Debian's ``prometheus`` (``apt-get install prometheus``; tools/setup_env.sh
installs it) on a free port of 127.0.0.1 with a generated scrape configuration
and storage in a temporary directory, and asks its HTTP API with PromQL:

    with PrometheusServer(["127.0.0.1:9464"], scrape_interval="1s") as prom:
        ...                                   # run what serves /metrics
        prom.query("sum(dynamicemb_table_usage)")
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import dist_launch  # examples/dist_launch.py: its users put examples/ on the path


class PrometheusServer:
    """A Prometheus process scraping ``targets`` (host:port of /metrics endpoints).

    Args:
        targets (list[str]): the endpoints to scrape, one job ``dynamicemb``.
        scrape_interval (str): Prometheus duration, e.g. ``"1s"``.
        binary (str): the prometheus executable (default: ``prometheus`` on PATH).
        workdir (str, optional): where the config and the storage go (default: a
            temporary directory removed by ``stop``).
    """

    def __init__(
        self,
        targets: list[str],
        scrape_interval: str = "1s",
        binary: str = "prometheus",
        workdir: str | None = None,
    ) -> None:
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.binary = binary
        self.workdir = workdir
        self.url = ""
        self._proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def start(self, timeout: float = 60.0) -> "PrometheusServer":
        exe = shutil.which(self.binary)
        if exe is None:
            raise FileNotFoundError(
                f"{self.binary!r} is not installed: `apt-get install prometheus` "
                "(tools/setup_env.sh installs it)"
            )
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="prometheus-")
            self.workdir = self._tmp.name
        config = {
            "global": {"scrape_interval": self.scrape_interval},
            "scrape_configs": [
                {
                    "job_name": "dynamicemb",
                    "scrape_interval": self.scrape_interval,
                    "scrape_timeout": self.scrape_interval,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }
        config_path = os.path.join(self.workdir, "prometheus.yml")
        with open(config_path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        port = dist_launch.free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(os.path.join(self.workdir, "prometheus.log"), "w+")
        self._proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={os.path.join(self.workdir, 'data')}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"prometheus was not ready within {timeout} s")
            time.sleep(0.2)

    def log(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-4000:]

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._tmp is not None:
            self._log.close()
            self._tmp.cleanup()
            self._tmp = None
            self.workdir = None

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ queries --

    def _get(self, path: str, **params) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                answer = json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{params}: {e.read().decode(errors='replace')}") from e
        if answer.get("status") != "success":
            raise RuntimeError(f"{params}: {answer}")
        return answer["data"]

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict, float]]:
        """An instant query: (labels, value) of each series."""
        params = {"query": promql} if at is None else {"query": promql, "time": at}
        data = self._get("/api/v1/query", **params)
        return [(s["metric"], float(s["value"][1])) for s in data["result"]]

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[tuple[dict, list[tuple[float, float]]]]:
        """A range query: (labels, [(time, value), ...]) of each series."""
        data = self._get("/api/v1/query_range", query=promql, start=start, end=end, step=step)
        return [
            (s["metric"], [(float(t), float(v)) for t, v in s["values"]]) for s in data["result"]
        ]

    def wait_until_down(self, timeout: float = 30.0) -> None:
        """Waits until every target's latest scrape failed (``up`` is 0): what
        they served before has been stored."""
        deadline = time.monotonic() + timeout
        while True:
            up = self.query('up{job="dynamicemb"}')
            if len(up) == len(self.targets) and all(v == 0 for _, v in up):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"targets still up after {timeout} s: {up}")
            time.sleep(0.3)
