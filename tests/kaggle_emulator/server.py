"""The emulated Kaggle over HTTP: one handler for RPCs, blob PUTs and signed-URL GETs."""
from __future__ import annotations

import email.utils
import json
import re
import shutil
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from kaggle_emulator.files import _drain
from kaggle_emulator.model import MAX_RPC_BODY_BYTES, _CHUNK


_RPC_PATH = re.compile(r"/(?:api/)?v1/([A-Za-z0-9_.]+)/([A-Za-z0-9_]+)")
_PAGE_PATH = re.compile(r"/code/([A-Za-z0-9_-]+)/([A-Za-z0-9_-]+)")
_STOP_PATH = re.compile(r"/code/([A-Za-z0-9_-]+)/([A-Za-z0-9_-]+)/stop")
_LOG_PATH = re.compile(r"/(?:api/)?v1/kernels/logs/stream/([A-Za-z0-9_-]+)/([A-Za-z0-9_-]+)")

if TYPE_CHECKING:
    from kaggle_emulator.core import KaggleEmulator


class _Handler(BaseHTTPRequestHandler):
    server_version = "KaggleEmulator/1"

    @property
    def emulator(self) -> KaggleEmulator:
        return self.server.emulator  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # Quiet: tests read `recorded()`; the request line holds nothing worth printing.

    def _path(self) -> str:
        # Through HTTP_PROXY the request line carries the whole URL (KAGGLE_API_ENVIRONMENT=LOCALHOST).
        return urlsplit(self.path).path

    def _send(self, status: int, payload: bytes, content_type: str = "application/json",
              headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, body: dict, headers: dict | None = None) -> None:
        if "__html__" in body:  # an error page labelled as JSON, as Kaggle sends when busy (kaggle_emulator.overnight)
            self._send(status, body["__html__"].encode(), headers=headers)
            return
        self._send(status, json.dumps(body).encode(), headers=headers)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        stop = _STOP_PATH.fullmatch(self._path())
        if stop:  # the kernel page's Stop session button
            _drain(self.rfile, min(int(self.headers.get("Content-Length") or 0), MAX_RPC_BODY_BYTES), False)
            status = self.emulator.stop_from_page(*stop.groups())
            self._send(status, b"", "text/plain", {"Location": f"/code/{stop.group(1)}/{stop.group(2)}"})
            return
        match = _RPC_PATH.fullmatch(self._path())
        length = int(self.headers.get("Content-Length") or 0)
        if match is None or length > MAX_RPC_BODY_BYTES:
            _drain(self.rfile, min(length, MAX_RPC_BODY_BYTES), False)
            code = 404 if match is None else 413
            self._send_json(code, {"code": code, "message": "Not found" if code == 404 else "Body too large"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            self._send_json(400, {"code": 400, "message": "The body is not a JSON object"})
            return
        status, reply, headers = self.emulator.rpc(match.group(1), match.group(2),
                                                   self.headers.get("Authorization"), body)
        self._send_json(status, reply, headers)

    def _send_log(self, owner: str, slug: str) -> None:
        """The log stream: a whole body, or server-sent events written as they come."""
        query = parse_qs(urlsplit(self.path).query)
        version = (query.get("versionLabel") or [None])[0]
        status, content_type, body = self.emulator.log_stream(owner, slug, version, self.headers.get("Authorization"))
        if isinstance(body, bytes):
            self._send(status, body, content_type)
            return
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # HTTP/1.0: the body ends when the connection does
        self.end_headers()
        try:
            for chunk in body:
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:
            pass  # the reader went away

    def do_PUT(self) -> None:  # noqa: N802
        match = re.fullmatch(r"/upload/([0-9a-f]+)", self._path())
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        length = None if chunked else int(self.headers.get("Content-Length") or 0)
        if match is None:
            _drain(self.rfile, length, chunked)
            self._send_json(404, {"code": 404, "message": "Not found"})
            return
        status, headers = self.emulator.upload(match.group(1), self.headers.get("Content-Range"),
                                               self.rfile, length, chunked)
        self._send(status, b"", "text/plain", headers)

    def do_GET(self) -> None:  # noqa: N802
        path = self._path()
        if path in ("/", "/health"):
            self._send(200, b"kaggle emulator\n", "text/plain")
            return
        page = _PAGE_PATH.fullmatch(path)
        if page:
            status, body = self.emulator.kernel_page(*page.groups())
            self._send(status, body, "text/html; charset=utf-8")
            return
        logs = _LOG_PATH.fullmatch(path)
        if logs:
            self._send_log(*logs.groups())
            return
        match = re.fullmatch(r"/download/([A-Za-z0-9_-]+)", path)
        status, file = self.emulator.download(match.group(1)) if match else (404, None)
        if file is None:
            self._send(status, b"Not available\n", "text/plain")
            return
        size = file.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.send_header("Last-Modified", email.utils.formatdate(file.stat().st_mtime, usegmt=True))
        self.end_headers()
        with open(file, "rb") as f:
            shutil.copyfileobj(f, self.wfile, _CHUNK)


# ---------------------------------------------------------------------------------------------
# Command line

