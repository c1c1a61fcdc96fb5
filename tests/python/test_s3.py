"""Checkpoints in an S3 bucket, on moto's server started on 127.0.0.1: the bucket tests
(bucket_cases.py), and what is S3's own: AWS credentials."""
import os

import pytest

import tessel
from bucket_cases import *  # noqa: F401,F403 - the tests, collected here against S3
from bucket_cases import BUCKET
from object_store import S3Store, moto_server
from trees import random_array


@pytest.fixture(scope="module")
def server():
    with moto_server() as endpoint:
        yield S3Store(endpoint, BUCKET)


@pytest.fixture
def store(server, monkeypatch):
    """tessel pointed at the server: credentials and the endpoint from the environment."""
    server.point_at(monkeypatch)
    return server


def test_missing_aws_credentials_are_named(rng, tmp, store, monkeypatch):
    url = store.url(f"creds-{rng.randrange(10**9)}")
    tessel.checkpoint.save(url, {"w": random_array(rng, (8, 4), "float32")})
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.path.join(tmp, "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", os.path.join(tmp, "none"))
    with pytest.raises(tessel.IoError, match="no AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        tessel.checkpoint.restore(url)
