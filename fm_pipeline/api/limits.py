"""Refuse request bodies over a size limit (413) before the application reads them."""

from __future__ import annotations

import json

DEFAULT_MAX_BODY_BYTES = 64 * 1024


class BodySizeLimit:
    """ASGI middleware: a declared Content-Length over the limit is refused at once; a body
    without one (chunked) is read up to the limit, then replayed to the application."""

    def __init__(self, app, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                return await _reply(send, 400, "Content-Length is not a number")
            if length > self.max_bytes:
                return await _reply(send, 413, self._too_large(length))
            return await self.app(scope, receive, send)
        messages, total = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                return await _reply(send, 413, self._too_large(total, at_least=True))
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)

    def _too_large(self, size: int, *, at_least: bool = False) -> str:
        return (f"request body of {'at least ' if at_least else ''}{size} bytes is over the "
                f"{self.max_bytes}-byte limit")


async def _reply(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
