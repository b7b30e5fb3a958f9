"""Headless Chromium driven over the DevTools protocol: load a page, wait until its visible
text satisfies a condition, read the DOM, take a screenshot. One browser start per page.

    with HeadlessChromium(binary, profile=tmp_path / "profile") as browser:
        browser.open(url)
        text = browser.wait_for_text(lambda t: "data_mix" in t, timeout_s=60)
        browser.screenshot(tmp_path / "page.png")
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import websocket  # websocket-client

from tests.ui.processes import stop_group

# The flags NOTES-stack.md lists for Debian's chromium as root in a container.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


class HeadlessChromium:
    def __init__(self, binary: str, *, profile: Path, width: int = 1600, height: int = 1000,
                 start_timeout_s: float = 60):
        self.binary, self.profile = binary, profile
        self.size, self.start_timeout_s = (width, height), start_timeout_s
        self._ids = itertools.count(1)

    def __enter__(self) -> HeadlessChromium:
        self.profile.mkdir(parents=True, exist_ok=True)
        cmd = [self.binary, *FLAGS, f"--user-data-dir={self.profile}",
               f"--window-size={self.size[0]},{self.size[1]}", "--remote-debugging-port=0",
               "about:blank"]
        self._log = open(self.profile / "chromium.log", "wb")
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        try:
            self._ws = websocket.create_connection(self._page_socket(), timeout=30,
                                                   suppress_origin=True)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._ws.close()
        finally:
            self._stop()

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        """What a user reads: the body's rendered text (innerText)."""
        return self.evaluate("document.body ? document.body.innerText : ''")

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def wait_for_text(self, ready: Callable[[str], bool], *, timeout_s: float) -> str:
        """The page text once `ready(text)` holds; AssertionError with the text otherwise."""
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if ready(text):
                return text
            time.sleep(0.5)
        raise AssertionError(f"page not ready after {timeout_s} s; its text:\n{text[:3000]}")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def call(self, method: str, **params) -> dict:
        """One DevTools command; events arriving before its answer are skipped."""
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})

    def _page_socket(self) -> str:
        # Chromium writes the port it picked to DevToolsActivePort once it listens.
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited {self._proc.returncode}: "
                                   f"{(self.profile / 'chromium.log').read_text()[-2000:]}")
            if port_file.exists() and port_file.read_text().strip():
                port = int(port_file.read_text().split()[0])
                try:
                    targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                except httpx.HTTPError:
                    targets = []
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.2)
        raise RuntimeError(f"chromium did not open its DevTools port in {self.start_timeout_s} s")

    def _stop(self) -> None:
        try:
            stop_group(self._proc, grace_s=15)
        finally:
            self._log.close()
