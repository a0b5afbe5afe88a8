"""A small HTTP proxy that can drop client connections, to provoke the SDK's connection-level retries.

It serves one request per connection (answers carry `Connection: close`). Each accepted connection
takes the next step of its `plan`; once the plan is used up, connections are forwarded:

* `"cut_before"`: read the request, then close the connection without forwarding it;
* `"cut_after"`: forward the request, wait for the gateway's whole answer, then close the client's
  connection without sending a byte of it (the work was done, the client never hears of it);
* `"forward"`: forward the request and relay the answer.

The client sees a closed connection (`RemoteProtocolError`), which openai-python retries.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import httpx

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class CuttingProxy:
    def __init__(self, target: str, plan: list[str]) -> None:
        self.target = target.rstrip("/")
        self.plan = list(plan)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.getsockname()[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._server.close()

    def __enter__(self) -> "CuttingProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                step = self.plan.pop(0) if self.plan else "forward"
            # One connection at a time: the SDK sends its attempts one after another.
            self._serve(conn, step)

    def _serve(self, conn: socket.socket, step: str) -> None:
        with conn:
            conn.settimeout(30)
            method, path, headers, body = read_request(conn)
            with self._lock:
                self.requests.append({"step": step, "method": method, "path": path, "headers": headers})
            if step == "cut_before":
                return
            forwarded = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
            answer = httpx.request(method, self.target + path, headers=forwarded, content=body, timeout=60)
            if step == "cut_after":
                return
            head = [f"HTTP/1.1 {answer.status_code} {answer.reason_phrase}"]
            head += [f"{k}: {v}" for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP]
            head += [f"content-length: {len(answer.content)}", "connection: close"]
            conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + answer.content)


def read_request(conn: socket.socket) -> tuple[str, str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("client closed before sending a whole request head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("client closed before sending the whole body")
        body += chunk
    return method, path, headers, body
