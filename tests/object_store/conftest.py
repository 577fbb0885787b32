"""One S3 endpoint (s3_server.py) for the tests of this package."""

import pytest

from tests.object_store.s3_server import S3Server


@pytest.fixture(scope="session")
def s3():
    server = S3Server()
    yield server
    server.stop()
