"""Real servers for the remote cache tests: nginx with WebDAV PUT (the Debian package setup.sh
installs) on a free loopback port, and tiny socket servers that misbehave on purpose (drop the
connection mid-body, never answer, answer 503). No HTTP is mocked.
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from conftest import require

NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {www};
        location / {{
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            client_max_body_size 0;
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).is_file()), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class Nginx:
    """nginx serving (and accepting PUTs into) `www`, as a foreground process of this test."""

    def __init__(self, root: Path):
        binary = nginx_binary()
        require(binary is not None, "nginx missing (./setup.sh installs it)")
        self.root, self.www = root, root / "www"
        self.www.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.conf = root / "nginx.conf"
        self.conf.write_text(NGINX_CONF.format(tmp=root, www=self.www, port=self.port))
        self.proc = subprocess.Popen([binary, "-p", str(root), "-e", str(root / "error.log"),
                                      "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_listening(self.port)
        except OSError:
            self.stop()
            raise AssertionError(f"nginx did not start: {self.proc.stderr.read().decode()}\n"
                                 f"{(root / 'error.log').read_text()}") from None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cache"

    def served(self, kind: str, name: str) -> Path:
        """The file on disk behind <url>/<kind>/<name>."""
        return self.www / "cache" / kind / name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc.stderr.close()


class SocketServer:
    """A loopback server answering each connection with `respond(method, path)`: raw bytes are sent and
    the connection closed; a list of byte strings is sent one every `trickle_s` seconds (a slow
    server); None keeps the connection open, never answering."""

    def __init__(self, respond, trickle_s: float = 0.4):
        self.respond, self.trickle_s = respond, trickle_s
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.requests: list[str] = []
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cache"

    def _serve(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = b""
            conn.settimeout(5)
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                conn.close()
                continue
            line = data.split(b"\r\n", 1)[0].decode(errors="replace")
            self.requests.append(line)
            parts = line.split(" ")
            answer = self.respond(parts[0], parts[1] if len(parts) > 1 else "/")
            if answer is None:
                self.held.append(conn)
                continue
            try:
                for i, chunk in enumerate([answer] if isinstance(answer, bytes) else answer):
                    if i:
                        time.sleep(self.trickle_s)
                    conn.sendall(chunk)
            except OSError:
                pass
            conn.close()

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()
        for conn in self.held:
            conn.close()


def http_response(status: str, body: bytes, length: int | None = None) -> bytes:
    """An HTTP/1.1 answer; `length` may claim more bytes than `body` has (a dropped body)."""
    head = (f"HTTP/1.1 {status}\r\nContent-Length: {len(body) if length is None else length}\r\n"
            f"Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
    return head.encode() + body
