"""Render a local HTML file in headless Chromium and report what a person would notice.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: commands on
fd 3, replies and events on fd 4, NUL-separated JSON), not by scraping its log: the protocol gives
every console message with its level, uncaught exceptions, failed resource loads and each
request the page makes, as structured events, and a full-page screenshot. (`--enable-logging`
prints console.log and console.error alike at INFO and never mentions a failed image load.)
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Rendered:
    png: bytes
    errors: list[str] = field(default_factory=list)     # console errors, exceptions, failed loads
    requests: list[str] = field(default_factory=list)   # every URL the page asked for
    text: str = ""                                       # document.body.innerText


class _Pipe:
    def __init__(self, proc, write_fd: int, read_fd: int):
        self.proc, self.write_fd, self.read_fd = proc, write_fd, read_fd
        self.buffer, self.next_id, self.events = b"", 0, []

    def _messages(self, deadline: float):
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                yield json.loads(raw)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                return
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buffer += chunk

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.write_fd, json.dumps(msg).encode() + b"\0")
        for reply in self._messages(time.monotonic() + timeout):
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"no reply to {method} within {timeout} s")

    def wait_event(self, method: str, timeout: float) -> bool:
        if any(e.get("method") == method for e in self.events):
            return True
        for event in self._messages(time.monotonic() + timeout):
            self.events.append(event)
            if event.get("method") == method:
                return True
        return False

    def drain(self, seconds: float) -> None:
        self.events.extend(self._messages(time.monotonic() + seconds))


def render(html: Path, width: int = 1200, timeout: float = 60) -> Rendered:
    """Load `html` (file://), wait for load, then collect problems and a full-page PNG."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed")
    profile = tempfile.mkdtemp(prefix="modelyard-chromium-")
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()

    def wire():  # in the child: the protocol's fixed descriptors (dup2 leaves them inheritable)
        r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)  # above 4: the pipes may sit on 3 and 4
        os.dup2(r, 3)
        os.dup2(w, 4)

    proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=wire, close_fds=False)
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    pipe = _Pipe(proc, to_chrome_w, from_chrome_r)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)
        session = pipe.call("Target.attachToTarget", {"targetId": target["targetId"],
                                                      "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.call(f"{domain}.enable", session=session)
        pipe.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900,
                                                         "deviceScaleFactor": 1, "mobile": False},
                  session=session)
        pipe.call("Page.navigate", {"url": Path(html).resolve().as_uri()}, session=session)
        if not pipe.wait_event("Page.loadEventFired", timeout):
            raise TimeoutError(f"{html} did not finish loading within {timeout} s")
        pipe.drain(0.5)  # late console messages
        text = pipe.call("Runtime.evaluate", {"expression": "document.body.innerText",
                                              "returnByValue": True},
                         session=session)["result"].get("value", "")
        shot = pipe.call("Page.captureScreenshot", {"format": "png",
                                                    "captureBeyondViewport": True},
                         session=session, timeout=timeout)
        result = Rendered(png=base64.b64decode(shot["data"]), text=text)
        for event in pipe.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                result.errors.append("console: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                result.errors.append("exception: " + params["exceptionDetails"].get("text", ""))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                result.errors.append(f"log: {params['entry'].get('text', '')} "
                                     f"{params['entry'].get('url', '')}".strip())
            elif method == "Network.loadingFailed":
                result.errors.append(f"load failed: {params.get('errorText')}")
            elif method == "Network.requestWillBeSent":
                result.requests.append(params["request"]["url"])
        return result
    finally:
        try:
            pipe.call("Browser.close", timeout=5)
        except Exception:
            pass
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
