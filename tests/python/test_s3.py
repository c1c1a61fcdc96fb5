"""Checkpoints in an S3 bucket, on moto's server started on 127.0.0.1: the bucket tests
(bucket_cases.py), and what is S3's own: AWS credentials, fixed or temporary (a web identity
exchanged at moto's STS, a container's credentials endpoint, the EC2 instance metadata service:
a role assumed with another profile's keys; the last two stand-ins served by the test)."""
import os
import re
import sys
import time
import xml.etree.ElementTree as ET

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

import tessel
from bucket_cases import *  # noqa: F401,F403 - the tests, collected here against S3
from bucket_cases import BUCKET
from object_store import AwsCredentialServer, FaultProxy, S3Store, moto_server
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
    without_keys(monkeypatch, tmp)
    with pytest.raises(tessel.IoError, match="no AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.*"
                                             "no web identity .*container .*EC2 instance metadata"):
        tessel.checkpoint.restore(url)


def without_keys(monkeypatch, tmp):
    """No fixed keys anywhere tessel looks, and no instance metadata service asked."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.path.join(tmp, "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", os.path.join(tmp, "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def signed_with(proxy) -> list[tuple[str, str]]:
    """(access key, session token) of each signed request the proxy saw."""
    out = []
    for authorization, token in zip(proxy.authorizations, proxy.security_tokens):
        if authorization:
            out.append((re.search(r"Credential=([^/]+)/", authorization).group(1), token))
    return out


def round_trip(rng, store, name):
    values = {"w": random_array(rng, (rng.randrange(8, 40), 8), "float32"), "b": random_array(rng, (8,), "float32")}
    url = store.url(f"{name.lower()}-{rng.randrange(10**9)}")
    tessel.checkpoint.save(url, values)
    got = tessel.checkpoint.restore(url)
    for k, want in values.items():
        assert_bit_identical(got[k].to_numpy(), want, k)
    return url


def round_trip_through_sts(rng, store, monkeypatch, action):
    """round_trip with S3 and STS (moto's) behind one proxy; the proxy, and the access key and
    session token of STS's one answer to `action`."""
    with FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", proxy.endpoint)
        round_trip(rng, store, action)
    answers = [body for _, _, _, body in proxy.answers if f"<{action}Response".encode() in body]
    assert len(answers) == 1, "one exchange: the credentials are kept until they near their expiry"
    ns = {"sts": "https://sts.amazonaws.com/doc/2011-06-15/"}
    creds = ET.fromstring(answers[0]).find(f"sts:{action}Result/sts:Credentials", ns)
    return proxy, creds.find("sts:AccessKeyId", ns).text, creds.find("sts:SessionToken", ns).text


def test_web_identity_credentials_come_from_sts(rng, tmp, store, monkeypatch):
    """EKS's service-account roles: a token file and a role ARN, exchanged at STS (moto's, unsigned
    AssumeRoleWithWebIdentity) for temporary credentials that sign every S3 request, their session
    token beside."""
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZXNzZWwifQ.c2ln\n")
    without_keys(monkeypatch, tmp)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", token_file)
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/tessel-trainer")
    proxy, key, token = round_trip_through_sts(rng, store, monkeypatch, "AssumeRoleWithWebIdentity")
    signed = signed_with(proxy)
    assert signed and set(signed) == {(key, token)}, (key, set(signed))
    assert proxy.authorizations.count("") == 1  # the exchange itself is unsigned

    os.remove(token_file)
    monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "another")  # a new client: nothing held
    with pytest.raises(tessel.IoError, match=r"getting AWS credentials from web identity \(role "
                                             r"arn:aws:iam::123456789012:role/tessel-trainer.*cannot read the token file"):
        tessel.checkpoint.restore(store.url("any"))


def test_a_profiles_role_is_assumed_with_its_source_profiles_keys(rng, tmp, store, monkeypatch):
    """A profile with role_arn and source_profile (another account's role): STS's AssumeRole,
    signed with the source profile's keys, hands the keys that sign every S3 request."""
    without_keys(monkeypatch, tmp)
    source_key = f"AKIA{rng.randrange(10**12):012d}"
    with open(os.path.join(tmp, "credentials"), "w") as f:
        f.write(f"[base]\naws_access_key_id = {source_key}\naws_secret_access_key = base-secret\n")
    with open(os.path.join(tmp, "config"), "w") as f:
        f.write("[profile reader]\nrole_arn = arn:aws:iam::123456789012:role/checkpoint-reader\n"
                "source_profile = base\nrole_session_name = tessel-reader\nexternal_id = ext-42\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.path.join(tmp, "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", os.path.join(tmp, "config"))
    monkeypatch.setenv("AWS_PROFILE", "reader")
    proxy, key, token = round_trip_through_sts(rng, store, monkeypatch, "AssumeRole")
    signed = signed_with(proxy)
    assert signed[0] == (source_key, ""), signed[0]  # the AssumeRole request itself
    assert set(signed[1:]) == {(key, token)}
    # The AssumeRole request's signature is the one botocore computes for the same request.
    (path, headers, body), = [p for p in proxy.posts if b"Action=AssumeRole&" in p[2]]
    assert b"ExternalId=ext-42" in body and b"RoleSessionName=tessel-reader" in body
    scope = re.search(r"Credential=[^/]+/(\d+)/([^/]+)/sts/aws4_request", headers["authorization"])
    request = AWSRequest("POST", proxy.endpoint + path, data=body,
                         headers={"Content-Type": headers["content-type"], "Host": headers["host"],
                                  "X-Amz-Date": headers["x-amz-date"]})
    request.context["timestamp"] = headers["x-amz-date"]
    auth = SigV4Auth(Credentials(source_key, "base-secret"), "sts", scope.group(2))
    want = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    assert headers["authorization"].endswith(f"Signature={want}"), (headers["authorization"], want)


def test_a_profiles_credential_process_gives_the_keys(rng, tmp, store, monkeypatch):
    """A profile's credential_process (a command printing credentials as JSON, Version 1): run
    once, its keys sign every request while they last; its failure is named."""
    without_keys(monkeypatch, tmp)
    key, token = f"ASIA{rng.randrange(10**12):012d}", f"token-{rng.randrange(10**9)}"
    script = os.path.join(tmp, "creds.py")
    with open(script, "w") as f:
        f.write("import json, sys\n"
                f"open({os.path.join(tmp, 'runs')!r}, 'a').write('run\\n')\n"
                f"json.dump({{'Version': 1, 'AccessKeyId': {key!r}, 'SecretAccessKey': 'process-secret', "
                f"'SessionToken': {token!r}, 'Expiration': '2099-01-01T00:00:00Z'}}, sys.stdout)\n")
    with open(os.path.join(tmp, "config"), "w") as f:
        f.write(f"[profile tool]\ncredential_process = {sys.executable} {script}\n"
                f"[profile broken]\ncredential_process = {sys.executable} -c \"import sys; sys.exit(7)\"\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.path.join(tmp, "config"))
    monkeypatch.setenv("AWS_PROFILE", "tool")
    with FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        url = round_trip(rng, store, "process")
        assert set(signed_with(proxy)) == {(key, token)}
        with open(os.path.join(tmp, "runs")) as f:
            assert f.read() == "run\n"
        monkeypatch.setenv("AWS_PROFILE", "broken")
        with pytest.raises(tessel.IoError, match=r"credential_process of AWS profile 'broken' .*exited with status 7"):
            tessel.checkpoint.restore(url)


def test_container_credentials_are_fetched_and_renewed(rng, tmp, store, monkeypatch):
    """ECS task roles and EKS Pod Identity: credentials from the container's endpoint, asked with
    the token in AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, kept until halfway through a short life and
    then fetched again."""
    token = f"pod-identity-{rng.randrange(10**9)}"
    token_file = os.path.join(tmp, "pod-token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    without_keys(monkeypatch, tmp)
    with AwsCredentialServer(rng, token=token, life_s=4) as creds, \
            FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", creds.endpoint + creds.container_path)
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file)
        url = round_trip(rng, store, "container")
        handed_before, signed_before = len(creds.handed), len(signed_with(proxy))
        assert handed_before >= 1
        time.sleep(2.5)  # past half of the 4 s life
        tessel.checkpoint.restore(url)
        handed = {(c["AccessKeyId"], c["Token"]) for c in creds.handed}
        assert set(signed_with(proxy)) <= handed
        later = {(c["AccessKeyId"], c["Token"]) for c in creds.handed[handed_before:]}
        assert later and set(signed_with(proxy)[signed_before:]) <= later, "the restore after the wait used new keys"

        # Keys the store calls expired before their stated time: fetched again, the request sent again.
        stale = creds.handed[-1]["AccessKeyId"]
        refused = []

        def refuse(method, path, authorization):
            if f"Credential={stale}/" in authorization:
                refused.append(path)
                return 400, b"<Error><Code>ExpiredToken</Code><Message>The provided token has expired.</Message></Error>"
            return None

        proxy.refuse = refuse
        handed_before = len(creds.handed)
        got = tessel.checkpoint.restore(url)
        assert refused and len(creds.handed) == handed_before + 1, (refused, len(creds.handed))
        assert got["b"].shape == (8,)
        proxy.refuse = None

        creds.fail_with = 500
        monkeypatch.setenv("TESSEL_S3_MAX_ATTEMPTS", "3")  # a new client: nothing held
        with pytest.raises(tessel.IoError, match=rf"getting AWS credentials from the container credentials endpoint "
                                                 rf"{re.escape(creds.endpoint)}/v2/credentials/\w+: HTTP 500"):
            tessel.checkpoint.restore(url)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.169.254.example/creds")
    with pytest.raises(tessel.ArgumentError, match="neither https:// nor on the loopback"):
        tessel.checkpoint.restore(url)


def test_instance_metadata_credentials_with_imdsv2(rng, tmp, store, monkeypatch):
    """An EC2 instance's role: IMDSv2's session token, the role's name, its credentials."""
    without_keys(monkeypatch, tmp)
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    with AwsCredentialServer(rng, role=f"role-{rng.randrange(10**6)}") as creds, \
            FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", creds.endpoint + "/")
        round_trip(rng, store, "imds")
        base = "/latest/meta-data/iam/security-credentials/"
        assert creds.requests == [("PUT", "/latest/api/token"), ("GET", base), ("GET", base + creds.role)]
        assert set(signed_with(proxy)) == {(creds.handed[0]["AccessKeyId"], creds.handed[0]["Token"])}
        creds.role = ""  # an instance without a role
        monkeypatch.setenv("TESSEL_S3_MAX_ATTEMPTS", "3")
        with pytest.raises(tessel.IoError, match=r"EC2 instance metadata service at .*: the instance has no IAM role"):
            tessel.checkpoint.restore(store.url("any"))
