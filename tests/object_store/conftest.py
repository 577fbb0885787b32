"""One S3 endpoint (s3_server.py) for the tests of this package."""

from tests.object_store.s3_server import s3  # noqa: F401
