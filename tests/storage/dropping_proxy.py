"""An S3-compatible endpoint that ignores conditional writes: a proxy on 127.0.0.1 in front
of a real one (moto's server) that forwards every request but drops If-None-Match and
If-Match, as some S3-compatible stores and gateways do."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

DROPPED = {"if-none-match", "if-match"}
HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "host"}


class DroppingProxy:
    def __init__(self, upstream: str):
        target = urlsplit(upstream)
        self.dropped = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {}
                for k, v in self.headers.items():
                    if k.lower() in DROPPED:
                        proxy.dropped += 1
                    elif k.lower() not in HOP:
                        headers[k] = v
                headers["Host"] = target.netloc
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                finally:
                    conn.close()
                self.send_response(reply.status, reply.reason)
                for k, v in reply.getheaders():
                    if k.lower() not in HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> DroppingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
