"""A fault-injecting, rate-limiting HTTP reverse proxy in front of an S3 server, for tests and
for the object-store benchmark (``python -m tests.s3proxy``: a slowed S3 endpoint of its own
process, whose counters ``GET /__proxy__/counters`` gives as JSON)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, replace
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

BLOCK = 64 * 1024
COUNTERS_PATH = "/__proxy__/counters"
# Hop-by-hop headers (RFC 9110 7.6.1), plus those the proxy sets itself.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "proxy-connection", "expect", "host", "content-length"}
)  # fmt: skip


@dataclass
class Fault:
    """What the proxy does to matching requests."""

    method: str | None = None  # e.g. "GET"; None: any
    key_contains: str = ""  # substring of the URL path (bucket/key), "" matches all
    status: int = 0  # answer this HTTP status with an S3 XML error body (0: forward)
    code: str = ""  # the S3 error code in that body, e.g. "SlowDown"
    times: int = 1  # how many matching requests it applies to (-1: every one)
    delay_s: float = 0.0  # sleep this long before answering (a stall past the client's timeout)
    # A cut body (GETs answered with data): send only this many bytes of the body, whose
    # Content-Length still says the whole, then end the connection (-1: send it all).
    cut_after: int = -1
    reset: bool = False  # end a cut body with a TCP RST (a reset) instead of a FIN (a short body)
    stall_s: float = 0.0  # after the cut bytes, stall this long before ending the connection
    pad: int = 0  # a GET's body answered with this many bytes more than the object holds

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and self.key_contains in path


def _path_of(target: str) -> str:
    """The unquoted path of a request target, without its query."""
    return unquote(urlsplit(target).path)


class _StoppedError(Exception):
    """The proxy is stopping: drop the connection without answering."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so every answer carries a Content-Length
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def end_headers(self) -> None:
        if not self.server.proxy.keep_alive:  # one request per connection, as moto's server
            self.send_header("Connection", "close")
            self.close_connection = True
        super().end_headers()

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.proxy._track(self.connection, add=False)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (OSError, _StoppedError):  # client gone (stall, timeout) or proxy stopping: quietly
            self.close_connection = True

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()  # CRLF after the chunk
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self) -> None:
        proxy = self.server.proxy
        body = self._body()  # read it always: an unread body would poison the keep-alive stream
        method, path = self.command, _path_of(self.path)
        if path == COUNTERS_PATH:
            self._answer_json(proxy.counters())
            return
        with proxy._lock:
            proxy.requests.append((method, self.path, self.headers.get("Range", "")))
        fault = proxy._take_fault(method, path)
        proxy._sleep(proxy.latency_s + (fault.delay_s if fault else 0.0))
        if fault is not None and fault.status:
            self._answer_error(fault, path)
        elif not self._serve_file(path, fault):
            self._forward(body, fault)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _serve  # noqa: N815

    def _serve_file(self, path: str, fault: Fault | None = None) -> bool:
        """GET or HEAD of an object the proxy serves from a file itself (``serve``; a key with
        no such file there is answered 404): True if answered, False to forward the request."""
        bucket, _, key = path.lstrip("/").partition("/")
        root = self.server.proxy.serve.get(bucket)
        if root is None or self.command not in ("GET", "HEAD") or not key:
            return False
        file = root / key
        try:
            st = file.stat()
        except OSError:
            st = None
        if st is None or not file.is_file() or not file.resolve().is_relative_to(root.resolve()):
            self._answer_error(Fault(status=404, code="NoSuchKey"), path)
            return True
        etag = '"' + hashlib.md5(f"{key}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest() + '"'
        wanted = self.headers.get("If-Match")
        if wanted and wanted.strip('"') != etag.strip('"'):
            self._answer_error(Fault(status=412, code="PreconditionFailed"), path)
            return True
        start, end, status = 0, st.st_size, 200
        spec = self.headers.get("Range", "")
        if spec.startswith("bytes=") and "," not in spec:
            first, _, last = spec[6:].partition("-")
            start = int(first) if first else max(0, st.st_size - int(last))
            end = min(st.st_size, int(last) + 1) if first and last else st.st_size
            status = 206
        data = b""
        if self.command == "GET":
            with file.open("rb") as f:
                data = os.pread(f.fileno(), max(0, end - start), start)
        self.send_response(status)
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "binary/octet-stream")
        self.send_header("Last-Modified", formatdate(st.st_mtime, usegmt=True))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{st.st_size}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        self._send_body(data, fault)
        return True

    def _answer_json(self, value: object) -> None:
        payload = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _answer_error(self, fault: Fault, path: str) -> None:
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?><Error>'
            f"<Code>{escape(fault.code)}</Code><Message>injected by S3Proxy</Message>"
            f"<Resource>{escape(path)}</Resource><RequestId>tierfeed-proxy</RequestId></Error>"
        ).encode()
        payload = b"" if self.command == "HEAD" else xml
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("x-amz-request-id", "tierfeed-proxy")
        self.end_headers()
        self.wfile.write(payload)

    def _forward(self, body: bytes, fault: Fault | None = None) -> None:
        proxy = self.server.proxy
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = b"" if self.command == "HEAD" else resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self._answer_error(Fault(status=502, code="BadGateway"), _path_of(self.path))
            return
        conn.close()
        if fault is not None and fault.pad and self.command == "GET":
            data += b"\0" * fault.pad  # a server that answers more than the range asked
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else len(data)
        self.send_header("Content-Length", str(length))  # HEAD: the upstream's, with no body
        self.end_headers()
        self._send_body(data, fault)

    def _send_body(self, data: bytes, fault: Fault | None) -> None:
        """Send the body, or with a cutting ``fault`` only its first bytes and then end the
        connection: with a FIN (a body shorter than its Content-Length) or an RST (a reset)."""
        proxy = self.server.proxy
        cut = fault is not None and fault.cut_after >= 0 and len(data) > fault.cut_after
        if fault is not None and cut:
            data = data[: fault.cut_after]
        with proxy._lock:
            proxy.bytes_out += len(data)
        self._write_paced(data)
        if fault is None or not cut:
            return
        self.wfile.flush()
        proxy._sleep(fault.stall_s)
        self.close_connection = True
        if fault.reset:  # SO_LINGER 0: close() sends an RST, not a FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            self.connection.shutdown(socket.SHUT_RDWR)

    def _write_paced(self, data: bytes) -> None:
        proxy = self.server.proxy
        if proxy.bandwidth_bps <= 0:
            self.wfile.write(data)
            return
        start = time.monotonic()
        for offset in range(0, len(data), BLOCK):
            block = data[offset : offset + BLOCK]
            self.wfile.write(block)
            due = (offset + len(block)) / proxy.bandwidth_bps
            proxy._sleep(due - (time.monotonic() - start))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver listens with a backlog of 5: a burst of new connections (one per request
    # without keep-alive) past it had its SYNs dropped, and the client's kernel sent them again
    # only after 1 s. A real S3 endpoint accepts the burst.
    request_queue_size = 128
    proxy: S3Proxy


class S3Proxy:
    """A threaded HTTP proxy on 127.0.0.1 forwarding to `upstream` (e.g. "http://127.0.0.1:PORT")."""

    def __init__(
        self,
        upstream: str,
        latency_s: float = 0.0,
        bandwidth_bps: float = 0.0,
        serve: dict[str, Path] | None = None,
        keep_alive: bool = True,
    ) -> None:
        parts = urlsplit(upstream)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        # bucket -> directory: GET and HEAD of the objects there are answered from the files
        # (moto copies a whole object for every ranged GET, under a lock per object: a
        # benchmark of ranged readers would measure that); everything else goes upstream.
        self.serve = dict(serve or {})
        # False: close every connection after its response. A client made before a fork
        # shares its pooled connection with the forked processes (MosaicML Streaming's
        # downloader does: it fetches index.json in the parent), whose responses then
        # interleave on the one socket; moto's own server never keeps a connection open.
        self.keep_alive = keep_alive
        self.url = ""
        self.requests: list[tuple[str, str, str]] = []
        self.bytes_out = 0  # body bytes sent to clients (GET data)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> S3Proxy:
        self._stop.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.proxy = self
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
            name=f"s3proxy-{server.server_address[1]}",
        )  # fmt: skip
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stop.set()  # wakes stalled and paced handlers
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # idle keep-alive connections: end their handler threads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def __enter__(self) -> S3Proxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()

    def inject(self, fault: Fault) -> None:
        """Add a fault; faults are matched in order, the first match wins."""
        with self._lock:
            self._faults.append(replace(fault))  # a copy: consuming it leaves the caller's alone

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def count(
        self, method: str | None = None, key_contains: str = "", ranged: bool | None = None
    ) -> int:
        """How many logged requests match: method, substring of the path, with a Range or not."""
        with self._lock:
            log = list(self.requests)
        return sum(
            1
            for m, target, rng in log
            if (method is None or m == method)
            and key_contains in _path_of(target)
            and (ranged is None or bool(rng) == ranged)
        )

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self.bytes_out = 0

    def counters(self) -> dict[str, int]:
        """Requests by method since the log was reset, and the body bytes sent."""
        with self._lock:
            methods = [m for m, _, _ in self.requests]
            out = self.bytes_out
        return {
            "requests": len(methods),
            "gets": methods.count("GET"),
            "heads": methods.count("HEAD"),
            "puts": methods.count("PUT") + methods.count("POST"),
            "bytes_out": out,
        }

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.times != 0 and fault.matches(method, path):
                    if fault.times > 0:
                        fault.times -= 1
                        if fault.times == 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _sleep(self, seconds: float) -> None:
        """Sleep, but raise `_StoppedError` as soon as the proxy stops (the wait wakes at once)."""
        if self._stop.wait(max(seconds, 0.0)):
            raise _StoppedError

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)


def main() -> None:
    """Run the proxy in the foreground until killed; its URL goes to ``--url-file``."""
    p = argparse.ArgumentParser(prog="python -m tests.s3proxy", description=main.__doc__)
    p.add_argument("--upstream", required=True, help="the S3 server, e.g. http://127.0.0.1:PORT")
    p.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    p.add_argument("--mbps", type=float, default=0.0, help="MB/s per response (0: no cap)")
    p.add_argument("--url-file", type=Path, required=True)
    p.add_argument(
        "--serve", action="append", default=[], metavar="BUCKET=DIR",
        help="answer GET and HEAD of BUCKET's objects from the files under DIR",
    )  # fmt: skip
    p.add_argument("--no-keep-alive", action="store_true", help="one request per connection")
    a = p.parse_args()
    serve = {b: Path(d) for b, _, d in (item.partition("=") for item in a.serve)}
    proxy = S3Proxy(a.upstream, a.latency_ms / 1e3, a.mbps * 1e6, serve, not a.no_keep_alive)
    proxy.start()
    a.url_file.write_text(proxy.url)
    try:
        threading.Event().wait()
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
