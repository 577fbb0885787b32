"""A real S3-compatible HTTP endpoint for the object store tests: moto's
server (``moto[server]``) in a thread on 127.0.0.1, reached through s3fs.

``S3Server`` starts it on a free port and points the environment at it
(``AWS_ENDPOINT_URL`` and dummy credentials, which s3fs, and every process
started afterwards, read); ``bucket`` makes a bucket and returns its URL.
``before_write``, when set, is called with (method, path) before the server
handles each request that changes objects (PUT, POST, DELETE); when it
returns True the request is not handled (the crash tests kill the writing
process there: the write it was making never happens). ``after_write``,
when set, is called once such a request was handled, before its response
is sent (a process killed there has made the write).
"""

import os
import threading
import uuid

import pytest

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
WRITES = ("PUT", "POST", "DELETE")


class S3Server:
    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args) -> None:  # no line per request
                pass

        self.before_write = None
        self.after_write = None
        self.writes = 0  # requests that changed objects, since the start
        app = DomainDispatcherApplication(create_backend_app)

        def hooked(environ, start_response):
            method = environ["REQUEST_METHOD"]
            if method not in WRITES:
                return app(environ, start_response)
            self.writes += 1
            hook = self.before_write
            if hook is not None and hook(method, environ.get("PATH_INFO", "")):
                start_response("503 Service Unavailable", [("Content-Length", "0")])
                return [b""]
            out = app(environ, start_response)
            if self.after_write is not None:
                self.after_write()
            return out

        self._server = make_server("127.0.0.1", 0, hooked, threaded=True, request_handler=Quiet)
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL")}
        os.environ.update(ENV, AWS_ENDPOINT_URL=self.endpoint)

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach the server."""
        return {**ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def bucket(self, name: str | None = None) -> str:
        """A new bucket's URL (``s3://<name>``)."""
        import fsspec

        name = name or f"b-{uuid.uuid4().hex[:12]}"
        fsspec.filesystem("s3").mkdir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3():
    """One endpoint for a test session (import the fixture where it is used)."""
    server = S3Server()
    yield server
    server.stop()


class FrozenServer:
    """An endpoint that accepts connections and never reads nor answers (a
    server that froze, a connection a middlebox dropped). ``env()`` points a
    process at it, as ``S3Server.env`` does."""

    def __init__(self) -> None:
        import socket

        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self._held = []  # accepted connections, kept open and silent
        self.endpoint = "http://127.0.0.1:%d" % self._socket.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:  # closed by stop()
                return
            self._held.append(conn)

    def env(self) -> dict[str, str]:
        return {**ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def stop(self) -> None:
        self._socket.close()
        for conn in self._held:
            conn.close()
