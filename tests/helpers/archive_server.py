"""A real HTTP server on 127.0.0.1 that serves archives, honours Range requests, logs every request,
and injects faults on demand (a dropped connection, corrupt bytes, an ignored Range, an HTTP error)."""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Request:
    method: str
    name: str
    range: str | None
    status: int
    bytes_sent: int


@dataclass
class Faults:
    # name -> faults for its next GETs, in order: "drop" (cut halfway), "corrupt", "ignore_range", "slow", or an
    # HTTP status such as "503" (the GET answered with it, the HEAD before it as usual)
    once: dict[str, list[str]] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)  # name -> HTTP status for every request
    ignore_range: bool = False
    slow_seconds: float = 4.0  # how long a "slow" transfer takes, unless released
    release: threading.Event = field(default_factory=threading.Event)  # set: a slow transfer sends the rest at once


class ArchiveServer:
    """Serve the files of `root` at http://127.0.0.1:<port>/<name>; use as a context manager."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.faults = Faults()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def do_HEAD(self) -> None:
                server._serve(self, head=True)

            def do_GET(self) -> None:
                server._serve(self, head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ArchiveServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def gets(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.name == name]

    def _record(self, *args: object) -> None:
        with self._lock:
            self.requests.append(Request(*args))  # type: ignore[arg-type]

    def _serve(self, handler: BaseHTTPRequestHandler, head: bool) -> None:
        name = handler.path.lstrip("/")
        method = "HEAD" if head else "GET"
        range_header = handler.headers.get("Range")
        path = self.root / name
        with self._lock:
            status = self.faults.status.get(name)
            fault = None
            if not head and self.faults.once.get(name):
                fault = self.faults.once[name].pop(0)
        if fault is not None and fault.isdigit():
            status = int(fault)
        if status is None and not path.is_file():
            status = 404
        if status is not None:
            self._record(method, name, range_header, status, 0)  # before answering: the client may retry at once
            handler.send_response(status)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        data = path.read_bytes()
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", range_header or "")
        if match and not self.faults.ignore_range and fault != "ignore_range":
            start = int(match.group(1))
            if start >= len(data):
                self._record(method, name, range_header, 416, 0)
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{len(data)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        body = data[start:]
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Accept-Ranges", "bytes")
        status_sent = 206 if start else 200
        # Every request is recorded before its answer is complete: a client may look at the log at once.
        if head:
            self._record(method, name, range_header, status_sent, 0)
            handler.end_headers()
            return
        handler.end_headers()
        if fault == "corrupt":
            body = bytes(b ^ 0xFF for b in body[:64]) + body[64:]
        if fault == "slow":  # time enough to kill whatever is fetching it
            self._record(method, name, range_header, status_sent, len(body))
            pieces = range(0, len(body), 256)
            for start in pieces:
                handler.wfile.write(body[start : start + 256])
                handler.wfile.flush()
                self.faults.release.wait(self.faults.slow_seconds / len(pieces))
            return
        if fault == "drop":
            half = body[: len(body) // 2]
            self._record(method, name, range_header, status_sent, len(half))
            handler.wfile.write(half)
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)
            handler.close_connection = True
            return
        self._record(method, name, range_header, status_sent, len(body))
        handler.wfile.write(body)
