"""Checkpoints in a Google Cloud Storage bucket, on the GCS emulator started on 127.0.0.1: the
bucket tests (bucket_cases.py); Orbax itself writing into the bucket (its paths through gcsfs, its
arrays through TensorStore's gcs kvstore) and tessel restoring that onto other meshes; and the
credentials Google's libraries use (a service account's signed JWT, an authorized user's refresh
token, workload identity federation's token exchange and impersonation, the metadata server), each
token sent with every request, and their failures named."""
import base64
import http.server
import json
import logging
import os
import urllib.parse

import jax
import pytest

import tessel
from bucket_cases import *  # noqa: F401,F403 - the tests, collected here against GCS
from bucket_cases import BUCKET, check_shards
from object_store import FaultProxy, GcsStore, LocalServer, gcs_server
from test_tessel_reads_orbax import random_jax_tree, save_with_manager, target_mesh
from trees import assert_bit_identical, random_array

logging.getLogger("gcsfs").setLevel(logging.ERROR)  # "could not determine bucket type" on an emulator


@pytest.fixture(scope="module")
def server():
    with gcs_server(BUCKET) as endpoint:
        yield GcsStore(endpoint, BUCKET)


@pytest.fixture
def store(server, monkeypatch):
    server.point_at(monkeypatch)
    return server


@pytest.mark.parametrize("layout", ["default", "files", "zarr3"])
def test_orbax_writes_into_the_bucket_and_tessel_restores(rng, x64, store, layout):
    devices = jax.devices()
    trees = {step: (random_jax_tree(rng, devices), random_jax_tree(rng, devices)) for step in (1, 2)}
    prefix = f"orbax/{layout}-{rng.randrange(10**9)}"
    url = store.url(prefix)
    steps = save_with_manager(url, layout, sorted(trees), {s: (a[1], b[1]) for s, (a, b) in trees.items()})
    keys = store.keys(prefix + "/")
    assert {f"{prefix}/{s}/commit_success.txt" for s in steps} <= set(keys), keys  # Orbax's own marker
    assert tessel.checkpoint.steps(url) == steps
    for step in steps:
        for item, (values, _, mesh) in zip(("items", "model_params"), trees[step]):
            target = target_mesh(rng, mesh.axis_names, rng.choice([2, 4, 16]))
            got = tessel.checkpoint.restore(f"{url}/{step}", item=item, mesh=target)
            check_shards(got, values, f"{url}/{step}/{item} on {target}")


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that answers JSON documents and logs nothing."""

    def log_message(self, *args):
        pass

    def answer(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class TokenServer(LocalServer):
    """Google's token endpoints, played on 127.0.0.1: the JWT bearer grant (the assertion's RS256
    signature checked against the service account's public key, and its claims), the refresh
    token grant, and the metadata server's token (only with Metadata-Flavor: Google)."""

    def __init__(self, public_key, email, user):
        self.requests = []
        self.sa_token = "sa-token"  # what the JWT bearer grant gives now
        server = self

        class Handler(JsonHandler):
            def do_GET(self):
                server.requests.append(("GET", self.path))
                if self.path != "/computeMetadata/v1/instance/service-accounts/default/token":
                    return self.answer(404, {"error": "not_found"})
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self.answer(403, {"error": "missing Metadata-Flavor"})
                self.answer(200, {"access_token": "vm-token", "expires_in": 3599, "token_type": "Bearer"})

            def do_POST(self):
                form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                grant = form.get("grant_type", [""])[0]
                server.requests.append(("POST", grant))
                if grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
                    claims = server.verify(form["assertion"][0], f"{server.url}/token")
                    if claims is None or claims["iss"] != email:
                        return self.answer(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
                    return self.answer(200, {"access_token": server.sa_token, "expires_in": 3600,
                                             "token_type": "Bearer"})
                if grant == "refresh_token" and all(form.get(k, [""])[0] == v for k, v in user.items()):
                    return self.answer(200, {"access_token": "user-token", "expires_in": 3600, "token_type": "Bearer"})
                self.answer(400, {"error": "invalid_grant"})

        self.public_key = public_key
        self._serve(Handler)
        self.url = self.endpoint

    def verify(self, jwt, audience):
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        def decode(part):
            return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

        header, claims, signature = jwt.split(".")
        try:
            self.public_key.verify(decode(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return None
        header, claims = json.loads(decode(header)), json.loads(decode(claims))
        assert header == {"alg": "RS256", "typ": "JWT"}, header
        assert claims["aud"] == audience and "devstorage" in claims["scope"], claims
        assert claims["exp"] - claims["iat"] == 3600, claims
        return claims


def rsa_pem():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return key.public_key(), pem


def test_application_default_credentials(rng, tmp, server, monkeypatch):
    """Against a store that wants a token (a proxy answering 401 to any other Authorization): no
    credentials is a 401 naming where they were looked for; a service account key file, gcloud's
    authorized_user file and the metadata server each give the token, fetched once and sent with
    every request; a token server's refusal and a bad credentials file are named."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GOOGLE_APPLICATION_CREDENTIALS",
                 "GCE_METADATA_HOST", "GCE_METADATA_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", os.path.join(tmp, "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    os.makedirs(os.path.join(tmp, "gcloud"))
    public_key, pem = rsa_pem()
    email = "trainer@project.iam.gserviceaccount.com"
    user = {"client_id": "cid", "client_secret": "secret", "refresh_token": f"refresh-{rng.randrange(10**9)}"}
    tree = {"w": random_array(rng, (96, 40), "float32"), "b": random_array(rng, (40,), "float32")}

    with TokenServer(public_key, email, user) as tokens, FaultProxy(server.endpoint, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", proxy.endpoint)  # the endpoint, credentials as usual
        url = server.url(f"auth-{rng.randrange(10**9)}")

        proxy.require = "Bearer sa-token"
        with pytest.raises(tessel.IoError, match=r"answered HTTP 401 \(Anonymous caller does not have access\); "
                                                 r"credentials: no credentials: GOOGLE_APPLICATION_CREDENTIALS is not set"):
            tessel.checkpoint.restore(url)

        def credentials_file(doc):
            path = os.path.join(tmp, f"creds-{rng.randrange(10**9)}.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            return path

        sa = {"type": "service_account", "client_email": email, "private_key": pem, "token_uri": f"{tokens.url}/token",
              "project_id": "project", "private_key_id": "k1"}
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", credentials_file(sa))
        del proxy.authorizations[:]
        tessel.checkpoint.save(url, tree)
        for name, value in tessel.checkpoint.restore(url, mesh=tessel.Mesh({"x": 4})).items():
            assert_bit_identical(value.to_numpy(), tree[name], name)
        assert tokens.requests == [("POST", "urn:ietf:params:oauth:grant-type:jwt-bearer")], tokens.requests
        assert len(proxy.authorizations) > 5 and set(proxy.authorizations) == {"Bearer sa-token"}

        # The store stops taking the token before it expires (revoked, rotated): a new one is
        # fetched once, and the refused requests are sent again with it.
        tokens.sa_token = "sa-token-2"
        proxy.require = "Bearer sa-token-2"
        before = len(tokens.requests)
        for name, value in tessel.checkpoint.restore(url).items():
            assert_bit_identical(value.to_numpy(), tree[name], name)
        assert tokens.requests[before:] == [("POST", "urn:ietf:params:oauth:grant-type:jwt-bearer")], tokens.requests
        assert proxy.authorizations[-1] == "Bearer sa-token-2"
        # The same in the middle of a resumable upload: the store stops taking the token after the
        # first chunk; the refused chunk goes again with a new token, and the object is whole.
        puts = []

        def rotate_at_second_chunk(method, path):
            if method == "PUT":  # only a resumable session's chunks and status queries are PUTs
                puts.append(path)
                if len(puts) == 2:
                    tokens.sa_token = "sa-token-5"
                    proxy.require = "Bearer sa-token-5"

        big = {"w": random_array(rng, (rng.randrange(1100, 1500), 4096), "float32")}  # 17 to 24 MiB: two chunks
        before = len(tokens.requests)
        proxy.on_request = rotate_at_second_chunk
        try:
            tessel.checkpoint.save(url + "-big", big)
        finally:
            proxy.on_request = None
        assert len(puts) >= 3, puts  # two chunks, the second twice
        assert len(tokens.requests) > before
        assert set(tokens.requests[before:]) == {("POST", "urn:ietf:params:oauth:grant-type:jwt-bearer")}
        assert_bit_identical(tessel.checkpoint.restore(url + "-big")["w"].to_numpy(), big["w"], "saved across a new token")
        # A new token the store refuses too: its 401 is the answer (one renewal per request, no loop).
        tokens.sa_token = "sa-token-3"
        proxy.require = "Bearer sa-token-4"
        before = len(tokens.requests)
        with pytest.raises(tessel.IoError, match=r"answered HTTP 401"):
            tessel.checkpoint.restore(url)
        assert len(tokens.requests) > before
        assert set(tokens.requests[before:]) == {("POST", "urn:ietf:params:oauth:grant-type:jwt-bearer")}

        # gcloud's application default credentials file, when the variable names none.
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
        with open(os.path.join(tmp, "gcloud", "application_default_credentials.json"), "w") as f:
            json.dump({"type": "authorized_user", "token_uri": f"{tokens.url}/token"} | user, f)
        proxy.require = "Bearer user-token"
        for name, value in tessel.checkpoint.restore(url).items():
            assert_bit_identical(value.to_numpy(), tree[name], name)
        assert tokens.requests[-1] == ("POST", "refresh_token")
        os.remove(os.path.join(tmp, "gcloud", "application_default_credentials.json"))

        # The metadata server.
        monkeypatch.setenv("GCE_METADATA_HOST", tokens.url.removeprefix("http://"))
        proxy.require = "Bearer vm-token"
        for name, value in tessel.checkpoint.restore(url).items():
            assert_bit_identical(value.to_numpy(), tree[name], name)
        assert tokens.requests[-1] == ("GET", "/computeMetadata/v1/instance/service-accounts/default/token")
        monkeypatch.delenv("GCE_METADATA_HOST")

        # A key the token server does not know: its refusal, named.
        _, other_pem = rsa_pem()
        path = credentials_file(sa | {"private_key": other_pem})
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", path)
        with pytest.raises(tessel.IoError, match=rf"getting a GCS access token from {tokens.url}/token for the "
                                                 rf"service_account credentials in '{path}': HTTP 400"):
            tessel.checkpoint.restore(url)

    for doc, message in (({"type": "external_account"}, 'has no "audience"'),
                         ({"type": "impersonated_service_account"}, "has type 'impersonated_service_account'"),
                         ({"type": "service_account", "client_email": email}, 'has no "private_key"'),
                         ({"type": "service_account", "client_email": email, "private_key": "not a key"},
                          "not a PEM private key")):
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", credentials_file(doc))
        with pytest.raises(tessel.Error, match=message):
            tessel.checkpoint.restore(url)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", os.path.join(tmp, "missing.json"))
    with pytest.raises(tessel.Error, match="GOOGLE_APPLICATION_CREDENTIALS names '.*missing.json', which cannot be read"):
        tessel.checkpoint.restore(url)


class FederationServer(LocalServer):
    """A stand-in for workload identity federation's services: a subject token served at /subject
    (JSON, for a request with the Metadata header), Google's STS at /v1/token (RFC 8693 token
    exchange of that subject token for a federated token), and IAM Credentials'
    generateAccessToken for a service account (the federated token for the account's own)."""

    def __init__(self, rng, audience):
        self.subject = f"eyJ.subject-{rng.randrange(10**9)}.sig"
        self.audience = audience
        self.federated = f"federated-{rng.randrange(10**9)}"
        self.impersonated = f"impersonated-{rng.randrange(10**9)}"
        self.requests = []
        server = self

        class Handler(JsonHandler):
            def do_GET(self):
                server.requests.append(("GET", self.path))
                if self.path == "/subject" and self.headers.get("Metadata") == "True":
                    return self.answer(200, {"id_token": server.subject})
                self.answer(404, {"error": "not_found"})

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                server.requests.append(("POST", self.path))
                if self.path == "/v1/token":
                    form = {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
                    want = {"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange", "audience": server.audience,
                            "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
                            "subject_token": server.subject, "subject_token_type": "urn:ietf:params:oauth:token-type:jwt"}
                    if any(form.get(k) != v for k, v in want.items()) or "devstorage" not in form.get("scope", ""):
                        return self.answer(400, {"error": "invalid_grant", "error_description": f"bad exchange {form}"})
                    return self.answer(200, {"access_token": server.federated, "expires_in": 3600, "token_type": "Bearer",
                                             "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})
                if self.path.endswith(":generateAccessToken"):
                    if self.headers.get("Authorization") != f"Bearer {server.federated}":
                        return self.answer(401, {"error": {"code": 401}})
                    assert json.loads(body)["lifetime"] == "3600s"
                    return self.answer(200, {"accessToken": server.impersonated, "expireTime": "2099-01-01T00:00:00Z"})
                self.answer(404, {"error": "not_found"})

        self._serve(Handler)
        self.url = self.endpoint


def test_workload_identity_federation(rng, tmp, server, monkeypatch):
    """An external_account credentials file (GKE off Google, other clouds, OIDC providers): the
    subject token from a file or a URL, exchanged at STS for a federated token, and, where the file
    names a service account to impersonate, that for the account's token; the token the store sees
    is the last one. Its failures and the sources tessel does not read are named."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GCE_METADATA_HOST", "GCE_METADATA_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", os.path.join(tmp, "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    audience = "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/providers/oidc"
    tree = {"w": random_array(rng, (rng.randrange(8, 48), 16), "float32")}

    def credentials(doc):
        path = os.path.join(tmp, f"external-{rng.randrange(10**9)}.json")
        with open(path, "w") as f:
            json.dump({"type": "external_account", "audience": audience,
                       "subject_token_type": "urn:ietf:params:oauth:token-type:jwt"} | doc, f)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", path)
        return path

    with FederationServer(rng, audience) as fed, FaultProxy(server.endpoint, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", proxy.endpoint)
        url = server.url(f"federated-{rng.randrange(10**9)}")
        token_file = os.path.join(tmp, "subject-token")
        with open(token_file, "w") as f:
            f.write(fed.subject + "\n")
        # A file's subject token, no impersonation: the federated token itself.
        credentials({"token_url": f"{fed.url}/v1/token", "credential_source": {"file": token_file}})
        proxy.require = f"Bearer {fed.federated}"
        tessel.checkpoint.save(url, tree)
        assert_bit_identical(tessel.checkpoint.restore(url)["w"].to_numpy(), tree["w"], "federated")
        assert fed.requests == [("POST", "/v1/token")], fed.requests
        # A URL's JSON subject token, then the service account impersonated.
        impersonation = f"{fed.url}/v1/projects/-/serviceAccounts/trainer@p.iam.gserviceaccount.com:generateAccessToken"
        credentials({"token_url": f"{fed.url}/v1/token", "service_account_impersonation_url": impersonation,
                     "credential_source": {"url": f"{fed.url}/subject", "headers": {"Metadata": "True"},
                                           "format": {"type": "json", "subject_token_field_name": "id_token"}}})
        proxy.require = f"Bearer {fed.impersonated}"
        del fed.requests[:]
        assert_bit_identical(tessel.checkpoint.restore(url)["w"].to_numpy(), tree["w"], "impersonated")
        assert fed.requests == [("GET", "/subject"), ("POST", "/v1/token"),
                                ("POST", "/v1/projects/-/serviceAccounts/trainer@p.iam.gserviceaccount.com"
                                         ":generateAccessToken")], fed.requests
        # STS refusing the subject token: named.
        with open(token_file, "w") as f:
            f.write("a-token-sts-does-not-know")
        path = credentials({"token_url": f"{fed.url}/v1/token", "credential_source": {"file": token_file}})
        with pytest.raises(tessel.IoError, match=rf"exchanging the subject token at {fed.url}/v1/token for the "
                                                 rf"external_account credentials in '{path}': HTTP 400"):
            tessel.checkpoint.restore(url)
    for source, message in (({"environment_id": "aws1", "region_url": "http://169.254.169.254"}, '"environment_id"'),
                            ({"executable": {"command": "/bin/true"}}, '"executable"'),
                            ({}, 'needs one of "file" and "url"'),
                            ({"file": "/x", "format": {"type": "json"}}, "needs subject_token_field_name")):
        credentials({"token_url": "https://sts.googleapis.com/v1/token", "credential_source": source})
        with pytest.raises(tessel.Error, match=message):
            tessel.checkpoint.restore(url)
