"""Object stores for the tests, on 127.0.0.1 with free ports: moto's S3 server (a subprocess,
started bounded in time and always stopped), and a proxy in front of it that injects the faults
real stores give (503 SlowDown, 500, 429, connections dropped) on a share of the requests."""
from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import boto3

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(timeout_s: float = 60):
    """moto's S3 server; yields its endpoint URL. Killed on exit, also when the test fails."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=open(os.environ.get("TESSEL_MOTO_LOG", os.devnull), "w"), start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto's server exited with {proc.returncode} before it answered")
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not answer on {endpoint} within {timeout_s} s")
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.kill()
        proc.wait(timeout=30)


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        region_name=CREDENTIALS["AWS_REGION"])


def upload_tree(client, local_dir: str, bucket: str, prefix: str) -> int:
    """Every file below local_dir as an object under prefix; returns the bytes uploaded."""
    total = 0
    for root, _, files in os.walk(local_dir):
        for name in files:
            path = os.path.join(root, name)
            key = prefix + "/" + os.path.relpath(path, local_dir).replace(os.sep, "/")
            client.upload_file(path, bucket, key)
            total += os.path.getsize(path)
    return total


class FaultProxy:
    """An HTTP proxy to `upstream` that answers a share `rate` of the requests with a fault instead
    of forwarding them: 503 SlowDown, 500 InternalError, 429, or a dropped connection. Counts what
    it did in `forwarded` and `faults`. `corrupt(method, path)`, when set and true, flips a byte
    of a successful answer's body on its way (damage in transit)."""

    FAULTS = ("503", "500", "429", "drop")

    def __init__(self, upstream: str, rate: float, seed: int):
        self.upstream = upstream.removeprefix("http://")
        self.rate = rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.forwarded = 0
        self.faults = {f: 0 for f in self.FAULTS}
        self.corrupt = None
        self.corrupted = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                with proxy.lock:
                    fault = proxy.rng.choice(proxy.FAULTS) if proxy.rng.random() < proxy.rate else None
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
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
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

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
