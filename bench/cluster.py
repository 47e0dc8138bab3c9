"""A build on a Dask cluster of N workers on this machine against a local build, and what the
cluster costs per step.

    python bench/cluster.py [--target host] [--models DIR | --tiny N] [--workers 2] [--url URL] [--keep]

In a temporary folder (never the user's artifacts/), with a copy of the models (default: the
repository's models/; --tiny N: N tiny test models instead):

  1. local: an empty artifacts folder builds `doit -n 1 build target=T` (no cache);
  2. cluster: a `dask scheduler` on a free loopback port and N `dask worker --nthreads 1`
     processes, started from this checkout; a second empty artifacts folder builds
     `doit build target=T executor=dask scheduler=... cache=URL` (default URL: a file:// folder,
     which every worker of one machine reaches; --url points at a real server, which should
     start empty);
  3. the two builds' outputs are compared byte for byte (logs and bookkeeping aside), and every
     step's log must say which worker ran it.

Prints both wall times and their ratio, and per step (from the `.cluster.json` records the
client writes beside each log): submission to start on a worker (the scheduling overhead; a
worker's first step also imports the stage's toolchain), end on the worker to the result here,
and result to outputs restored from the cache. Exits 1 if the outputs differ or a step did not
run on a worker.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import doit, executed, temporary  # noqa: E402 (after the path is set)

BOOKKEEPING = {".doit.db", ".cache", "logs", ".tmp", ".lock", ".store"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def outputs(artifacts: Path) -> dict[str, str]:
    return {p.relative_to(artifacts).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(artifacts.rglob("*"))
            if p.is_file() and p.relative_to(artifacts).parts[0] not in BOOKKEEPING}


def build(ws: Path, target: str, *variables: str, options: tuple = ()) -> tuple[float, subprocess.CompletedProcess]:
    elapsed, result = doit(ws, *options, "build", f"target={target}", *variables)
    if result.returncode != 0:
        raise SystemExit(f"cluster bench: the build in {ws} failed ({result.returncode}):\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed, result


class Cluster:
    """A scheduler and `n` workers (one step at a time each) on loopback."""

    def __init__(self, root: Path, n: int):
        self.root, self.port, self.procs = root, free_port(), []
        root.mkdir(parents=True, exist_ok=True)
        self._start("scheduler", ["distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--no-dashboard"])
        wait_listening(self.port)
        for i in range(n):
            self._start(f"w{i}", ["distributed.cli.dask_worker", self.address, "--nthreads", "1",
                                  "--name", f"w{i}", "--no-dashboard",
                                  "--local-directory", str(root / "dask")])
        import distributed
        with distributed.Client(self.address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(n, timeout=120)

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _start(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.log", "w") as log:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "MODELYARD_WORKER_DIR": str(self.root / "workers")},
                start_new_session=True))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return f"median {statistics.median(ordered):.3f} s, p90 {p90:.3f} s, max {ordered[-1]:.3f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="host")
    ap.add_argument("--models", type=Path, default=REPO / "models")
    ap.add_argument("--tiny", type=int, default=0, help="N tiny test models instead of --models")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--url", default=None, help="the remote cache (default: a file:// folder)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()

    with temporary("modelyard-cluster-bench-", args.keep) as tmp:
        local, remote = tmp / "local", tmp / "cluster"
        for ws in (local, remote):
            if args.tiny:
                sys.path.insert(0, str(REPO / "tests"))
                from conftest import add_tiny_model
                for i in range(args.tiny):
                    add_tiny_model(ws / "models", f"tiny{i}", seed=100 + i)
            else:
                shutil.copytree(args.models, ws / "models")
        url = args.url or f"file://{tmp / 'cache'}"

        local_s, local_result = build(local, args.target, options=("-n", "1"))
        print(f"local  (doit -n 1): {local_s:8.1f} s, {len(executed(local_result))} tasks")

        cluster = Cluster(tmp / "dask", args.workers)
        try:
            cluster_s, cluster_result = build(remote, args.target, "executor=dask",
                                              f"scheduler={cluster.address}", f"cache={url}")
        finally:
            cluster.stop()
        print(f"cluster ({args.workers} workers): {cluster_s:8.1f} s, "
              f"{len(executed(cluster_result))} tasks  ({cluster_s / local_s:.2f}x the local build)")

        records = [json.loads(p.read_text())
                   for p in sorted((remote / "artifacts" / "logs").glob("*/*.cluster.json"))]
        logs = sorted((remote / "artifacts" / "logs").glob("*/*.log"))
        off_worker = [p.name for p in logs if not p.read_text().startswith("# ran on dask worker")]
        on = {}
        for r in records:
            on[r["worker_name"]] = on.get(r["worker_name"], 0) + 1
        print(f"steps on workers: {len(records)} ({', '.join(f'{w}: {n}' for w, n in sorted(on.items()))})")
        print(f"  submission -> start on the worker: {spread([r['started'] - r['submitted'] for r in records])}")
        print(f"  end on the worker -> result here:  {spread([r['returned'] - r['finished'] for r in records])}")
        print(f"  result -> outputs restored here:   {spread([r['restored'] - r['returned'] for r in records])}")
        work = sum(r["finished"] - r["started"] for r in records)
        print(f"  step time on the workers: {work:.1f} s; cluster wall {cluster_s:.1f} s")

        a, b = outputs(local / "artifacts"), outputs(remote / "artifacts")
        differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        print(f"outputs: {len(a)} files, " + ("all byte-identical" if not differ else
                                              f"{len(differ)} differ: {differ[:10]}"))
        if off_worker:
            print(f"steps whose log names no worker: {off_worker}")
        return 1 if differ or off_worker else 0


if __name__ == "__main__":
    raise SystemExit(main())
