"""A TVM RPC board farm on this machine: a tracker and emulated aarch64 boards (qemu-user).

    python -m pipeline.run.tvm_farm --port 9190 --key rk3588 [--boards 1]   # until Ctrl-C

Real boards run `python -m tvm.exec.rpc_server --tracker HOST:9190 --key rk3588` (the aarch64
apache-tvm wheel, pip-installable on the board's Python 3.10+); `doit tune target=rk3588
tracker=HOST:9190 key=rk3588` then measures on them. Here an "emulated board" is the same
rpc_server on the aarch64 Python + TVM wheel that setup.sh unpacks, under qemu-user: it proves
the plumbing (upload, load, run, time) end to end; its timings mean nothing.

Every process the farm starts is in a process group of its own and is stopped with it (the
server's worker processes included).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import tvm.rpc

from ..core.errors import PipelineError
from ..core.tools import aarch64_tvm, qemu_aarch64, start_service, stop_services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Farm:
    """A tracker on 127.0.0.1:port and `boards` emulated aarch64 rpc_servers registered with it."""

    def __init__(self, key: str = "rk3588", port: int | None = None, boards: int = 1,
                 qemu_cpu: str = "cortex-a76", log_dir: Path | None = None):
        self.key, self.port, self.boards, self.qemu_cpu = key, port or free_port(), boards, qemu_cpu
        self.log_dir = Path(log_dir) if log_dir else None
        self.procs: list = []  # started by core.tools.start_service

    @property
    def tracker(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self, argv: list[str], name: str, env: dict | None = None):
        log = self.log_dir / f"{name}.log" if self.log_dir else None
        self.procs.append(start_service(argv, log=log, env=env))
        return self.procs[-1]

    def start(self, timeout: float = 180) -> "Farm":
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        qemu_aarch64(stage="tvm_farm")
        tv = aarch64_tvm(stage="tvm_farm")
        self._start([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                     "--port", str(self.port), "--port-end", str(self.port + 1)], "tracker")
        self._wait_for_port(timeout=60)
        env = {**os.environ, "QEMU_CPU": self.qemu_cpu}
        env.pop("TVM_USE_RUNTIME_LIB", None)  # MetaSchedule's measuring calls need the full TVM
        for k in range(self.boards):
            port = free_port()
            self._start([str(tv.python), "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                         "--port", str(port), "--port-end", str(port + 1),
                         "--tracker", self.tracker, "--key", self.key], f"board{k}", env=env)
        self._wait_for_boards(timeout)
        return self

    def _wait_for_port(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise PipelineError(f"the RPC tracker did not start on port {self.port}", stage="tvm_farm")

    def _wait_for_boards(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(p.poll() is not None for p in self.procs):
                self.stop()
                raise PipelineError("an emulated board or the tracker exited while starting",
                                    stage="tvm_farm", log=str(self.log_dir) if self.log_dir else None)
            queue = tvm.rpc.connect_tracker("127.0.0.1", self.port).summary()["queue_info"]
            if queue.get(self.key, {}).get("free", 0) >= self.boards:
                return
            time.sleep(1)
        self.stop()
        raise PipelineError(f"{self.boards} emulated board(s) did not register within {timeout:g} s",
                            stage="tvm_farm")

    def stop(self) -> None:
        """Stop every process group this farm started (boards first, then the tracker)."""
        stop_services(self.procs)
        self.procs.clear()

    def __enter__(self) -> "Farm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.run.tvm_farm")
    parser.add_argument("--port", type=int, default=9190)
    parser.add_argument("--key", default="rk3588")
    parser.add_argument("--boards", type=int, default=1)
    parser.add_argument("--qemu-cpu", default="cortex-a76")
    args = parser.parse_args(argv)
    with Farm(args.key, args.port, args.boards, args.qemu_cpu) as farm:
        print(f"tracker {farm.tracker}, {args.boards} emulated {args.key} board(s); "
              f"doit tune target=... tracker={farm.tracker} key={args.key} emulated=1", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
