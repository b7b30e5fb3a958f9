"""An S3 endpoint that goes down in the middle of an upload: a real moto server on
127.0.0.1 behind a small TCP relay that watches the requests going through.

    with OutageEndpoint() as s3:                       # s3.url: the endpoint to use
        s3.create_bucket("fm")
        s3.cut_when(b"step-00000004")                  # armed: the first request naming it
        ...                                            #   takes the endpoint down
        s3.wait_down(timeout_s=120)
        s3.restore()                                   # the endpoint answers again

Going down: the request that carried the marker is dropped, every open connection is
reset, the relay stops accepting (connection refused) and the moto server is stopped.
Restoring starts a moto server on the same port with the same in-process state (moto's
backends live in this process), and the relay accepts again. moto is a test dependency
(`pip install 'moto[server]'`).
"""

from __future__ import annotations

import os
import socket
import threading

from fm_pipeline.resilience.ports import free_port
from fm_pipeline.storage import open_store

MOTO_START_TIMEOUT_S = 30.0
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1"}



class OutageEndpoint:
    def __init__(self):
        self.moto_port = free_port()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._moto = None
        self._marker: bytes | None = None
        self._down = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.cut_request: bytes | None = None  # first line of the request that was dropped

    # --- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> OutageEndpoint:
        # moto takes any credentials; boto3 insists on some. Restored on exit.
        self._saved_env = {k: os.environ.get(k) for k in DUMMY_CREDENTIALS}
        for k, v in DUMMY_CREDENTIALS.items():
            os.environ.setdefault(k, v)
        self._start_moto()
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True,
                         name="s3-relay").start()
        return self

    def __exit__(self, *exc) -> None:
        self._take_down()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    @property
    def credentials(self) -> dict[str, str]:
        """The AWS_* variables a process needs to reach this endpoint."""
        return {k: os.environ.get(k, v) for k, v in DUMMY_CREDENTIALS.items()}

    def _start_moto(self) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as e:
            from fm_pipeline.resilience.injectors import Unavailable

            raise Unavailable(f"the S3 outage needs moto's server: pip install "
                              f"'moto[server]' ({e})") from None
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request
        # A fresh port each time: the old one may still be held (TIME_WAIT, a slow
        # shutdown), and moto's start() would then wait forever for a server that never
        # bound. The relay reads moto_port per connection; moto's state is in-process.
        self.moto_port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.moto_port,
                                    verbose=False)
        starter = threading.Thread(target=server.start, daemon=True, name="moto-start")
        starter.start()
        starter.join(MOTO_START_TIMEOUT_S)
        if starter.is_alive():
            raise RuntimeError(f"moto's S3 server did not start on 127.0.0.1:"
                               f"{self.moto_port} within {MOTO_START_TIMEOUT_S:.0f} s")
        self._moto = server

    def store(self, bucket: str, prefix: str = "fm"):
        return open_store(f"s3://{bucket}/{prefix}", endpoint_url=self.url)

    def create_bucket(self, bucket: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1").create_bucket(
            Bucket=bucket)

    # --- the outage --------------------------------------------------------------------

    def cut_when(self, marker: bytes) -> None:
        """Go down when a request whose bytes contain `marker` passes through."""
        self._marker = marker

    @property
    def down(self) -> bool:
        return self._down.is_set()

    def wait_down(self, *, timeout_s: float) -> bool:
        return self._down.wait(timeout_s)

    def _take_down(self) -> None:
        with self._lock:
            if self._down.is_set():
                return
            self._down.set()
            self._listener.close()
            for s in list(self._sockets):
                _close(s)
            self._sockets.clear()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None

    def restore(self) -> None:
        # moto starts outside the lock: relay threads winding down need it meanwhile.
        self._marker = None
        self._start_moto()
        with self._lock:
            self._listener = socket.create_server(("127.0.0.1", self.port))
            self._down.clear()
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True,
                         name="s3-relay").start()

    # --- relay -------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: the endpoint is down
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.moto_port))
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._down.is_set():
                    _close(client), _close(upstream)
                    return
                self._sockets |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if to_server and self._marker is not None and self._marker in chunk:
                    self.cut_request = chunk.split(b"\r\n", 1)[0]
                    self._take_down()  # this request never reaches the server
                    return
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(src), _close(dst)
            with self._lock:
                self._sockets -= {src, dst}


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
