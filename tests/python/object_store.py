"""Object stores for the tests, on 127.0.0.1 with free ports: moto's S3 server and the GCS
emulator (subprocesses, started bounded in time and always stopped), each behind a `Store` that
the bucket tests use whatever the store (URLs, the environment that points tessel and TensorStore
at it, listing, reading and writing objects), and a proxy in front of either that injects the
faults real stores give (503 SlowDown, 500, 429, connections dropped) on a share of the requests."""
from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import boto3

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server(name: str, argv: list[str], port: int, probe: str, timeout_s: float):
    """A server subprocess; yields its endpoint once `probe` answers. Killed on exit, also when the
    test fails."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True,
                            stderr=open(os.environ.get("TESSEL_STORE_LOG", os.devnull), "w"))
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} before it answered")
            try:
                urllib.request.urlopen(endpoint + probe, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not answer on {endpoint} within {timeout_s} s")
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.kill()
        proc.wait(timeout=30)


def moto_server(timeout_s: float = 60):
    """moto's S3 server; yields its endpoint URL."""
    port = free_port()
    return _server("moto's server", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                   port, "/moto-api/", timeout_s)


def gcs_server(bucket: str, timeout_s: float = 60):
    """The GCS emulator (gcs_emulator.py) holding an empty `bucket`; yields its endpoint URL."""
    port = free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    return _server("the GCS emulator", [sys.executable, os.path.join(here, "gcs_emulator.py"), "127.0.0.1",
                                        str(port), bucket], port, f"/storage/v1/b/{bucket}", timeout_s)


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        region_name=CREDENTIALS["AWS_REGION"])


def _prefix_and_delimiter(query: dict) -> tuple[str, str]:
    """A listing's prefix and delimiter from its parsed query (S3 and GCS name them alike)."""
    return query.get("prefix", [""])[0], query.get("delimiter", [""])[0]


class S3Store:
    """A bucket on moto's server, filled and inspected with boto3."""
    scheme = "s3"
    attempts_variable = "TESSEL_S3_MAX_ATTEMPTS"
    missing_bucket = "NoSuchBucket"

    def __init__(self, endpoint: str, bucket: str, create: bool = True):
        self.endpoint, self.bucket = endpoint, bucket
        self.client = s3_client(endpoint)
        if create:
            self.client.create_bucket(Bucket=bucket)

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def environment(self, endpoint: str | None = None) -> dict:
        """What points tessel at this server (or a proxy in front of it): credentials, endpoint."""
        return CREDENTIALS | {"AWS_ENDPOINT_URL_S3": endpoint or self.endpoint}

    def point_at(self, monkeypatch, endpoint: str | None = None):
        for name, value in self.environment(endpoint).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_PROFILE", raising=False)

    def keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def remove(self, key: str):
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def put(self, key: str, data: bytes):
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    @staticmethod
    def object_name(path: str) -> str | None:
        """The object a request path (as a proxy sees it) reads the bytes of, or None."""
        return urllib.parse.unquote(path.split("?")[0])

    def size_asked(self, method: str, path: str) -> str | None:
        """The object whose size (and nothing else) a request asks, or None: S3's HEAD."""
        return self.object_name(path).removeprefix(f"/{self.bucket}/") if method == "HEAD" else None

    def listing(self, method: str, path: str) -> tuple[str, str] | None:
        """The (prefix, delimiter) a request lists, or None: S3's ListObjectsV2."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query, keep_blank_values=True)
        return _prefix_and_delimiter(query) if method == "GET" and query.get("list-type") == ["2"] else None

    def kvstore(self, path: str) -> dict:
        """TensorStore's own kvstore for `path` in the bucket."""
        return {"driver": "s3", "bucket": self.bucket, "endpoint": self.endpoint,
                "aws_region": CREDENTIALS["AWS_REGION"], "path": path}


class GcsStore:
    """A bucket on the GCS emulator, filled and inspected through GCS's JSON API."""
    scheme = "gs"
    attempts_variable = "TESSEL_GCS_MAX_ATTEMPTS"
    missing_bucket = "HTTP 404"

    def __init__(self, endpoint: str, bucket: str, create: bool = False):  # the emulator made the bucket
        self.endpoint, self.bucket = endpoint, bucket

    def url(self, prefix: str) -> str:
        return f"gs://{self.bucket}/{prefix}"

    def environment(self, endpoint: str | None = None) -> dict:
        """What points tessel, TensorStore and gcsfs at this emulator (or a proxy in front of it)."""
        return {"STORAGE_EMULATOR_HOST": endpoint or self.endpoint, "TENSORSTORE_GCS_HTTP_URL": endpoint or self.endpoint,
                "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator"}  # TensorStore's: no credential search

    def point_at(self, monkeypatch, endpoint: str | None = None):
        for name, value in self.environment(endpoint).items():
            monkeypatch.setenv(name, value)

    def _object(self, key: str) -> str:
        return f"{self.endpoint}/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(key, safe='')}"

    def keys(self, prefix: str) -> list[str]:
        out, token = [], ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix} | ({"pageToken": token} if token else {}))
            with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b/{self.bucket}/o?{query}", timeout=60) as r:
                page = json.load(r)
            out += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def get(self, key: str) -> bytes:
        with urllib.request.urlopen(self._object(key) + "?alt=media", timeout=60) as r:
            return r.read()

    def remove(self, key: str):
        urllib.request.urlopen(urllib.request.Request(self._object(key), method="DELETE"), timeout=60).read()

    def put(self, key: str, data: bytes):
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        request = urllib.request.Request(f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o?{query}", data=data,
                                         method="POST", headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(request, timeout=60).read()

    @staticmethod
    def object_name(path: str) -> str | None:
        """The object a request path (as a proxy sees it) reads the bytes of, or None (its
        metadata, a listing, an upload)."""
        url = urllib.parse.urlsplit(path)
        if "alt=media" not in url.query.split("&"):
            return None
        return urllib.parse.unquote(url.path.split("/o/", 1)[1])

    def size_asked(self, method: str, path: str) -> str | None:
        """The object whose size (and nothing else) a request asks, or None: a GET of the object's
        metadata in GCS's JSON API."""
        url = urllib.parse.urlsplit(path)
        if method != "GET" or "alt=media" in url.query.split("&") or "/o/" not in url.path:
            return None
        return urllib.parse.unquote(url.path.split("/o/", 1)[1])

    def listing(self, method: str, path: str) -> tuple[str, str] | None:
        """The (prefix, delimiter) a request lists, or None: a GET of the bucket's objects."""
        url = urllib.parse.urlsplit(path)
        if method != "GET" or not url.path.endswith(f"/b/{self.bucket}/o"):
            return None
        return _prefix_and_delimiter(urllib.parse.parse_qs(url.query, keep_blank_values=True))

    def kvstore(self, path: str) -> dict:
        return {"driver": "gcs", "bucket": self.bucket, "path": path}


STORES = {"s3": S3Store, "gs": GcsStore}


def upload_tree(store, local_dir: str, prefix: str) -> int:
    """Every file below local_dir as an object under prefix; returns the bytes uploaded."""
    total = 0
    for root, _, files in os.walk(local_dir):
        for name in files:
            path = os.path.join(root, name)
            key = prefix + "/" + os.path.relpath(path, local_dir).replace(os.sep, "/")
            with open(path, "rb") as f:
                data = f.read()
            store.put(key, data)
            total += len(data)
    return total


class LocalServer:
    """An HTTP server on 127.0.0.1 with a free port, in a thread while the `with` block runs."""

    def _serve(self, handler):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class FaultProxy(LocalServer):
    """An HTTP proxy to `upstream` that answers a share `rate` of the requests with a fault instead
    of forwarding them: 503 SlowDown, 500 InternalError, 429, or a dropped connection. Counts what
    it did in `forwarded` and `faults`; keeps the Authorization headers it saw. `corrupt(method, path)`, when set and true, flips a byte
    of a successful answer's body on its way (damage in transit). `max_in_a_row`, when given, caps the
    faults one request (method and path) meets in a row below the clients' attempts: a test then
    does not fail on a rare run of faults (8 in a row at a rate of 0.3: about 1 request in 15,000).
    `delay` holds each forwarded request that long; `arrivals` says how many were in flight."""

    FAULTS = ("503", "500", "429", "drop")

    def __init__(self, upstream: str, rate: float, seed: int, max_in_a_row: int | None = None):
        self.authorizations = []  # each request's Authorization header ("" without)
        self.security_tokens = []  # each request's x-amz-security-token header ("" without)
        self.answers = []  # (method, path, status, body) of each forwarded request's answer
        self.posts = []  # (path, headers, body) of each POST
        self.require = None  # when set, a request without "Authorization: <require>" is answered 401
        self.on_request = None  # when set, called with (method, path) as a request comes in, before the rest
        # When set, called with (method, path, authorization); a (status, body) it returns is the answer.
        self.refuse = None
        self.upstream = upstream.removeprefix("http://")
        self.rate = rate
        self.rng = random.Random(seed)
        self.max_in_a_row = max_in_a_row
        self.in_a_row = {}  # (method, path): the faults it met since it was last forwarded
        self.lock = threading.Lock()
        self.forwarded = 0
        self.faults = {f: 0 for f in self.FAULTS}
        self.corrupt = None
        self.corrupted = 0
        self.delay = 0.0  # seconds each forwarded request waits first: a far bucket's round trip
        self.in_flight = 0
        self.arrivals = []  # (method, path, requests in flight with it) of each forwarded request
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                with proxy.lock:
                    if self.command == "POST":
                        proxy.posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    if proxy.on_request:
                        proxy.on_request(self.command, self.path)
                authorization = self.headers.get("Authorization", "")
                with proxy.lock:
                    proxy.authorizations.append(authorization)
                    proxy.security_tokens.append(self.headers.get("x-amz-security-token", ""))
                refusal = proxy.refuse(self.command, self.path, authorization) if proxy.refuse else None
                if refusal:
                    status, doc = refusal
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(doc)
                    return
                if proxy.require is not None and authorization != proxy.require:
                    doc = b'{"error": {"code": 401, "message": "Anonymous caller does not have access"}}'
                    self.send_response(401)
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(doc)
                    return
                with proxy.lock:
                    fault = proxy.rng.choice(proxy.FAULTS) if proxy.rng.random() < proxy.rate else None
                    request = (self.command, self.path)
                    if fault and proxy.max_in_a_row is not None and proxy.in_a_row.get(request, 0) >= proxy.max_in_a_row:
                        fault = None
                    proxy.in_a_row[request] = proxy.in_a_row.get(request, 0) + 1 if fault else 0
                    if fault:
                        proxy.faults[fault] += 1
                    else:
                        proxy.forwarded += 1
                if fault == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if fault:
                    code = {"503": "SlowDown", "500": "InternalError", "429": "TooManyRequests"}[fault]
                    doc = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(int(fault))
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    if self.command != "HEAD":  # an answer to HEAD has no body
                        self.wfile.write(doc)
                    return
                with proxy.lock:
                    proxy.in_flight += 1
                    proxy.arrivals.append((self.command, self.path, proxy.in_flight))
                try:
                    time.sleep(proxy.delay)
                    conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1
                with proxy.lock:
                    proxy.answers.append((self.command, self.path, r.status, data[:65536]))
                if data and 200 <= r.status < 300 and proxy.corrupt and proxy.corrupt(self.command, self.path):
                    data = bytes([data[0] ^ 0x40]) + data[1:]
                    with proxy.lock:
                        proxy.corrupted += 1
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)) if self.command != "HEAD" else r.getheader("Content-Length", "0"))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

        self._serve(Handler)


class AwsCredentialServer(LocalServer):
    """A stand-in for where AWS hands temporary credentials to a machine: an ECS/EKS container
    credentials endpoint (`container_path`, checking the Authorization header against `token`) and
    the EC2 instance metadata service (IMDSv2: PUT /latest/api/token, then the role's name and
    credentials under /latest/meta-data/iam/security-credentials/). Each fetch hands new random keys
    that expire `life_s` seconds later; `handed` keeps them in order, `requests` every (method,
    path). `fail_with`, when set, is the HTTP status every request gets."""

    def __init__(self, rng, role: str = "trainer-role", token: str = "", life_s: float = 3600):
        self.rng, self.role, self.token, self.life_s = rng, role, token, life_s
        self.container_path = "/v2/credentials/" + "".join(rng.choice("abcdef0123456789") for _ in range(12))
        self.handed, self.requests = [], []
        self.fail_with = None
        self.session = "".join(rng.choice("ABCDEFGHIJ") for _ in range(24))
        lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status: int, body: str):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def credentials(self) -> str:
                key = "ASIA" + "".join(server.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(16))
                creds = {"AccessKeyId": key, "SecretAccessKey": f"secret-{key}", "Token": f"token-{key}",
                         "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + server.life_s))}
                server.handed.append(creds)
                return json.dumps({"Code": "Success", "Type": "AWS-HMAC"} | creds)

            def handle_any(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                with lock:
                    server.requests.append((self.command, self.path))
                    if server.fail_with:
                        return self.answer(server.fail_with, "injected")
                    imds = "/latest/meta-data/iam/security-credentials/"
                    if self.command == "GET" and self.path == server.container_path:
                        if self.headers.get("Authorization", "") != server.token:
                            return self.answer(401, "bad authorization")
                        return self.answer(200, self.credentials())
                    if self.command == "PUT" and self.path == "/latest/api/token":
                        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                            return self.answer(400, "no ttl")
                        return self.answer(200, server.session)
                    if self.command == "GET" and self.path.startswith(imds):
                        if self.headers.get("X-aws-ec2-metadata-token") != server.session:
                            return self.answer(401, "no session token")
                        if self.path == imds:
                            return self.answer(200, server.role)
                        if self.path == imds + server.role:
                            return self.answer(200, self.credentials())
                    return self.answer(404, "not found")

            do_GET = do_PUT = handle_any

        self._serve(Handler)
