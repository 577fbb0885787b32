"""Where files live: a local folder, or an object store through fsspec.

``of(path)`` gives the filesystem of a path: ``Local`` for a plain path or a
``file://`` URL, ``ObjectStore`` for any other URL fsspec knows (``s3://``,
``gs://``, ``az://``, ``memory://``, ...). Both offer the same operations on
paths as given (a URL stays a URL, so ``os.path.join`` composes them), and
say whether they can rename (``renames``), which decides how
``dynamicemb.io.files`` publishes a folder: a local folder is written aside
and renamed into place; an object store has no rename, and a folder is
committed there by its manifest, written last, in a version prefix of its
own (``files.make_tmp``, ``files.publish``, ``files.committed``).

An operation resolves the path it is given once, at its entry (``at``): a
``Location`` is that path (a ``str``) with its filesystem (``fs``), and the
paths made from it (``join``, ``on``) keep it, so nothing below resolves a
path again.

``Local`` does what the library did before object stores: every file and
folder fsynced, ``os.rename``, ``shutil.rmtree``. ``ObjectStore`` writes an
object at once when its handle is closed (an object store shows an object
whole or not at all), has no folders (a prefix exists while it holds an
object), and reads every listing afresh (fsspec's listing cache cannot know
what other processes wrote).

fsspec and the filesystem's own package (s3fs for ``s3://``, gcsfs for
``gs://``, ...) are optional dependencies (``pip install 'dynamicemb[s3]'``);
a URL without them is an ``ImportError`` naming the package. Credentials,
endpoints and options come from the environment as fsspec and the package
read them (for s3fs: ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...;
``FSSPEC_S3_<OPTION>``, fsspec's configuration files).

Every request to an S3 store is bounded: it must connect within
``OBJECT_CONNECT_TIMEOUT_S``, an answer must not stall for
``OBJECT_READ_TIMEOUT_S``, and the request must have its answer within
``connect + read`` seconds plus its body's bytes at ``OBJECT_MIN_BYTES_PER_S``
(aiohttp's read timeout starts only once a body is sent: a server that takes
a request and never answers, never reads its body or never sends the
``100 Continue`` botocore asks for, a connection a middlebox dropped, would
hold it forever). A request that fails so is tried ``OBJECT_ATTEMPTS`` times
in all (botocore's standard retries; s3fs retries nothing on top). So a call
fails, as a ``TimeoutError`` naming the path and the limits, in bounded time,
never hangs. botocore options given in fsspec's configuration
(``config_kwargs``) take precedence over these.
"""

import asyncio
import functools
import os
import re
import shutil

__all__ = ["EXTRA", "Local", "Location", "ObjectStore", "at", "is_url", "local_path", "of"]

# setup.py's extra that installs the object store packages dynamicemb tests.
EXTRA = "s3"
# Bytes one read of an object asks for (a range request each).
OBJECT_READ_BYTES = 32 << 20
# Limits of a request to an S3 store (see the module docstring).
OBJECT_CONNECT_TIMEOUT_S = 10.0
OBJECT_READ_TIMEOUT_S = 60.0
OBJECT_MIN_BYTES_PER_S = 1 << 20
OBJECT_ATTEMPTS = 3
_S3 = ("s3", "s3a")

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_FILE_URL = "file://"


def is_url(path: str) -> bool:
    """Whether ``path`` names an object store (a URL other than ``file://``)."""
    return _URL.match(str(path)) is not None and not str(path).startswith(_FILE_URL)


def local_path(path: str) -> str:
    """A local path as ``os`` takes it: ``file://`` stripped."""
    path = os.fspath(path)
    return path[len(_FILE_URL) :] if path.startswith(_FILE_URL) else path


class Local:
    """Local files: ``os`` calls on the path (``file://`` stripped)."""

    renames = True
    _p = staticmethod(local_path)

    def absolute(self, path: str) -> str:
        return os.path.abspath(self._p(path))

    def exists(self, path: str) -> bool:
        return os.path.lexists(self._p(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self._p(path))

    def isfile(self, path: str) -> bool:
        return os.path.isfile(self._p(path))

    def islink(self, path: str) -> bool:
        return os.path.islink(self._p(path))

    def listdir(self, path: str) -> list[str]:
        """Names in folder ``path``, sorted (none: no such folder)."""
        path = self._p(path)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def size(self, path: str) -> int:
        return os.stat(self._p(path)).st_size

    def makedirs(self, path: str) -> None:
        os.makedirs(self._p(path), exist_ok=True)

    def mkdir(self, path: str) -> None:
        os.mkdir(self._p(path))

    def open_write(self, path: str):
        return open(self._p(path), "wb")

    @staticmethod
    def commit(f) -> None:
        """Closes a file of ``open_write``, its bytes on disk (fsynced)."""
        f.flush()
        os.fsync(f.fileno())
        f.close()

    @staticmethod
    def discard(f) -> None:
        f.close()

    def write_bytes(self, path: str, data: bytes) -> None:
        """A whole file, fsynced."""
        f = self.open_write(path)
        try:
            f.write(data)
        except BaseException:
            f.close()
            raise
        self.commit(f)

    def read_bytes(self, path: str) -> bytes:
        with open(self._p(path), "rb") as f:
            return f.read()

    def read_into(self, path: str, mv: memoryview) -> int:
        """Reads the start of file ``path`` into ``mv``; returns the bytes read."""
        got = 0
        with open(self._p(path), "rb") as f:
            while got < len(mv):
                n = f.readinto(mv[got:])
                if not n:
                    break
                got += n
        return got

    def fsync(self, path: str) -> None:
        """fsync of a file or folder by name."""
        fd = os.open(self._p(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        os.remove(self._p(path))

    def rmtree(self, path: str) -> None:
        """Removes a folder and all it holds, ignoring errors."""
        shutil.rmtree(self._p(path), ignore_errors=True)

    def rename(self, src: str, dst: str) -> None:
        os.rename(self._p(src), self._p(dst))

    def files_below(self, path: str) -> list[str]:
        """Every file below folder ``path``, as paths relative to it, sorted."""
        root = self._p(path)
        out = []
        for d, _, names in os.walk(root):
            out += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return sorted(out)


def _timeouts() -> tuple[type, ...]:
    """The exceptions of a request that got no answer in time."""
    out: tuple[type, ...] = (TimeoutError, asyncio.TimeoutError)
    try:
        from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

        out += (ReadTimeoutError, ConnectTimeoutError)
    except ImportError:
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        out += (FSTimeoutError,)
    except ImportError:
        pass
    return out


def _bounded(method):
    """An ``ObjectStore`` method whose request that got no answer in time is
    a ``TimeoutError`` naming the path and the limits."""

    @functools.wraps(method)
    def call(self, path, *args, **kwargs):
        try:
            return method(self, path, *args, **kwargs)
        except _timeouts() as e:
            raise TimeoutError(
                f"{path}: the object store did not answer in time ({limits()}): {e}"
            ) from None

    return call


class ObjectStore:
    """An fsspec filesystem for URLs of one protocol (see the module docstring).

    Args:
        fs: the fsspec filesystem (``fsspec.core.url_to_fs``).
        protocol (str): the URLs' protocol (``s3``).
    """

    renames = False

    def __init__(self, fs, protocol: str) -> None:
        self.fs = fs
        self.protocol = protocol

    def _fresh(self) -> None:
        self.fs.invalidate_cache()

    @staticmethod
    def _key(path: str) -> str:
        """``path`` as the filesystem names its objects (the protocol
        stripped, by fsspec's rule for it)."""
        from fsspec.core import strip_protocol

        return strip_protocol(path)

    def absolute(self, path: str) -> str:
        return str(path)

    @_bounded
    def exists(self, path: str) -> bool:
        self._fresh()
        return bool(self.fs.exists(path))

    @_bounded
    def isdir(self, path: str) -> bool:
        self._fresh()
        return bool(self.fs.isdir(path))

    @_bounded
    def isfile(self, path: str) -> bool:
        self._fresh()
        return bool(self.fs.isfile(path))

    def islink(self, path: str) -> bool:
        return False

    @_bounded
    def listdir(self, path: str) -> list[str]:
        """Names of the objects and prefixes right below ``path``, sorted."""
        self._fresh()
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        base = self._key(path).rstrip("/")
        names = {e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != base}
        return sorted(names)

    @_bounded
    def size(self, path: str) -> int:
        self._fresh()
        return int(self.fs.size(path))

    def makedirs(self, path: str) -> None:
        """Nothing: a prefix exists while it holds an object."""

    def mkdir(self, path: str) -> None:
        """Nothing: a prefix exists while it holds an object."""

    @_bounded
    def open_write(self, path: str):
        return self.fs.open(path, "wb")

    @staticmethod
    def commit(f) -> None:
        """Closes a file of ``open_write``: the object appears, whole."""
        try:
            f.close()
        except _timeouts() as e:
            raise TimeoutError(
                f"{getattr(f, 'path', f)}: the object store did not answer in time "
                f"({limits()}): {e}"
            ) from None

    @staticmethod
    def discard(f) -> None:
        """Drops a file of ``open_write`` unfinished: no object appears."""
        discard = getattr(f, "discard", None)
        if discard is not None:
            discard()  # an unfinished multipart upload is aborted
        try:
            f.closed = True  # so that no close (nor the collector's) uploads it
        except AttributeError:  # a file object whose closed is read-only
            pass

    @_bounded
    def write_bytes(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, bytes(data))

    @_bounded
    def read_bytes(self, path: str) -> bytes:
        return self.fs.cat_file(path)

    @_bounded
    def read_into(self, path: str, mv: memoryview) -> int:
        """Reads the start of object ``path`` into ``mv``, ``OBJECT_READ_BYTES``
        per request; returns the bytes read."""
        got = 0
        with self.fs.open(path, "rb", cache_type="none") as f:
            while got < len(mv):
                data = f.read(min(OBJECT_READ_BYTES, len(mv) - got))
                if not data:
                    break
                mv[got : got + len(data)] = data
                got += len(data)
        return got

    def fsync(self, path: str) -> None:
        """Nothing: a closed object is stored."""

    @_bounded
    def remove(self, path: str) -> None:
        self.fs.rm_file(path)

    @_bounded
    def rmtree(self, path: str) -> None:
        """Removes every object below ``path`` (and ``path``), ignoring errors."""
        self._fresh()
        try:
            self.fs.rm(path, recursive=True)
        except (FileNotFoundError, OSError):
            pass

    def rename(self, src: str, dst: str) -> None:
        raise OSError(f"{self.protocol}:// has no rename ({src} -> {dst})")

    @_bounded
    def files_below(self, path: str) -> list[str]:
        """Every object below ``path``, as paths relative to it, sorted (one
        listing, without delimiters)."""
        self._fresh()
        base = self._key(path).rstrip("/") + "/"
        try:
            keys = self.fs.find(path)
        except FileNotFoundError:
            return []
        return sorted(k[len(base) :] for k in keys if k.startswith(base))


_LOCAL = Local()


class Location(str):
    """A path resolved to its filesystem once (``at``): the path itself, a
    ``str`` every ``os`` and fsspec call takes, with its filesystem ``fs``.
    Sent to another process (pickled) it is the plain path again, which
    resolves there."""

    fs: "Local | ObjectStore"

    def __new__(cls, path: str, store: "Local | ObjectStore") -> "Location":
        self = super().__new__(cls, path)
        self.fs = store
        return self

    def join(self, *names: str) -> "Location":
        """``os.path.join(self, *names)`` on the same filesystem."""
        return Location(os.path.join(self, *names), self.fs)

    def on(self, path: str) -> "Location":
        """Another path of the same filesystem (a sibling, a parent)."""
        return Location(path, self.fs)

    def __reduce__(self):
        return str, (str(self),)


def at(path) -> Location:
    """``path`` with its filesystem (``of``): resolved here, once, unless it
    is a ``Location`` already."""
    if isinstance(path, Location):
        return path
    path = os.fspath(path)
    return Location(path, of(path))


def of(path: str) -> "Local | ObjectStore":
    """The filesystem of ``path``.

    Raises:
        ImportError: a URL without fsspec or without its protocol's package
            (naming it and the extra that installs it).
        ValueError: a URL of a protocol fsspec does not know.
    """
    path = os.fspath(path)
    if not is_url(path):
        return _LOCAL
    protocol = _URL.match(path).group(1)
    try:
        import fsspec
    except ImportError:
        raise ImportError(
            f"{path}: object store URLs need the package fsspec (and s3fs for s3://): "
            f"pip install 'dynamicemb[{EXTRA}]'"
        ) from None
    try:
        fs = fsspec.filesystem(protocol, **_options(protocol))
    except ImportError as e:
        raise ImportError(
            f"{path}: fsspec has no {protocol}:// filesystem installed ({e}); for s3:// "
            f"pip install 'dynamicemb[{EXTRA}]'"
        ) from None
    except ValueError as e:
        raise ValueError(f"{path}: not a filesystem fsspec knows ({e})") from None
    if protocol in _S3:
        fs.retries = 1  # botocore's attempts are all (s3fs would multiply them)
    return ObjectStore(fs, protocol)


def _options(protocol: str) -> dict:
    """fsspec options of a protocol's filesystem: for S3, the request limits
    (what fsspec's configuration gives for them wins)."""
    if protocol not in _S3:
        return {}
    from fsspec.config import conf

    config = {
        "connect_timeout": OBJECT_CONNECT_TIMEOUT_S,
        "read_timeout": OBJECT_READ_TIMEOUT_S,
        "retries": {"max_attempts": OBJECT_ATTEMPTS, "mode": "standard"},
        "http_session_cls": _bounded_session(),
    }
    config.update(conf.get(protocol, {}).get("config_kwargs") or {})
    return {"config_kwargs": config}


@functools.cache
def _bounded_session() -> type:
    """aiobotocore's HTTP session with a limit on each whole request (the
    module docstring), a botocore ``ReadTimeoutError`` past it (which
    botocore retries)."""
    from aiobotocore.httpsession import AIOHTTPSession
    from botocore.exceptions import ReadTimeoutError

    class BoundedSession(AIOHTTPSession):
        async def send(self, request):
            body = int(request.headers.get("Content-Length") or 0)
            limit = OBJECT_CONNECT_TIMEOUT_S + OBJECT_READ_TIMEOUT_S + body / OBJECT_MIN_BYTES_PER_S
            try:
                return await asyncio.wait_for(super().send(request), limit)
            except asyncio.TimeoutError:
                raise ReadTimeoutError(
                    endpoint_url=request.url, error=f"no answer within {limit:g} s"
                ) from None

    return BoundedSession


def limits() -> str:
    """The request limits, as an error message states them."""
    return (
        f"connect {OBJECT_CONNECT_TIMEOUT_S:g} s, answer {OBJECT_READ_TIMEOUT_S:g} s, "
        f"{OBJECT_ATTEMPTS} attempts"
    )
