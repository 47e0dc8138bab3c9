"""A TVM RPC tracker's boards, checked before tuning measures on them: reachable, the key known,
a board free (the tvm_tune stage's farm; run/tvm_farm.py starts emulated boards)."""
from __future__ import annotations

import socket
import time

from ..core.errors import PipelineError


def check_tracker(address: str, key: str, where: dict, wait_s: float = 60) -> dict:
    """Fail clearly, before any tuning, when the tracker is unreachable or has no free board."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except (OSError, ValueError) as exc:
        raise PipelineError(f"cannot reach the TVM RPC tracker at {address}: {exc}",
                            hint="start it (python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port "
                                 f"{port or 9190}) or give the right tracker=HOST:PORT",
                            **where) from None
    import tvm.rpc  # tvm: 2.8 s, not needed by doit list
    deadline = time.time() + wait_s
    while True:
        summary = tvm.rpc.connect_tracker(host, int(port)).summary()
        queue = summary.get("queue_info", {})
        if key not in queue:
            known = ", ".join(f"{k} ({v.get('free', 0)} free)" for k, v in sorted(queue.items()))
            raise PipelineError(f"the tracker at {address} has no board with key {key!r} "
                                f"(it has: {known or 'no boards at all'})",
                                hint=f"start a board's server with --key {key}, or give the key "
                                     f"the boards registered with", **where)
        if queue[key].get("free", 0) > 0:
            return queue[key]
        if time.time() > deadline:
            raise PipelineError(f"no free board with key {key!r} at {address} within {wait_s:g} s "
                                f"(busy: {queue[key]})", hint="wait for the running session to end,"
                                " or add boards with that key", **where)
        time.sleep(2)
