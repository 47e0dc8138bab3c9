"""A build on a Dask cluster of N workers on this machine against a local build, what the
cluster costs per step, and how far more machines could take the build (its critical path).

    python bench/cluster.py [--target host] [--models DIR] [--models-from DIR [--only S ...]]
                            [--tiny N] [--workers 2] [--url URL] [--keep]

In a temporary folder (never the user's artifacts/), per set of models: the repository's
models/ ("default"; --models DIR another folder), the public model files of --models-from DIR
("public": each through `doit new` with the shapes and hand edits of bench/public_models.py,
--only keeping the files whose name contains one of the strings), or --tiny N tiny test models
instead of both:

  1. local: an empty artifacts folder builds `doit -n 1 build target=T` (no cache), then
     `doit timings target=T` reads what every step took (its timing record, written beside its
     log) and the critical path through the step graph: the chain of dependent steps whose
     times add up to the most. No number of machines builds the set in less than that;
     with N machines, list scheduling needs at most work/N + path, and never less than
     max(path, work/N), the figure printed per N;
  2. cluster: a `dask scheduler` on a free loopback port and N `dask worker --nthreads 1
     --no-nanny` processes (a nanny would set the workers' BLAS threads to 1: refused) (started once, from this checkout, for every set); a second empty artifacts
     folder builds `doit build target=T executor=dask scheduler=... cache=URL` (default URL: a
     file:// folder per set, which every worker of one machine reaches; --url points at a real
     server, which should start empty);
  3. the two builds' outputs are compared byte for byte (logs and bookkeeping aside), their
     exit codes and the tasks they ran must be the same (a model that fails locally must fail
     the same way on the cluster), and every step's log must say which worker ran it.

Prints per set both wall times and their ratio, per step (from the `.cluster.json` records the
client writes beside each log) submission to start on a worker (the scheduling overhead; a
worker's first step also imports the stage's toolchain), end on the worker to the result here,
result to outputs restored from the cache; the critical path; then a table of every set. Exits
1 if outputs, exit codes or tasks differ, or a step did not run on a worker.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
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
PATH_LINE = re.compile(r"critical path \(([\d.]+) s of ([\d.]+) s of step time")
MACHINES = (2, 4, 8)


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
    """One build; a failing one is measured too (a model that fails must fail alike on both
    sides), unless nothing ran at all (the build could not start)."""
    elapsed, result = doit(ws, *options, "build", f"target={target}", *variables)
    if result.returncode != 0 and not executed(result):
        raise SystemExit(f"cluster bench: the build in {ws} failed ({result.returncode}) before "
                         f"any step ran:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed, result


def critical_path(ws: Path, target: str) -> tuple[float, float, list[str]]:
    """(path seconds, step seconds in all, the path's lines) from `doit timings`, which reads
    the steps' timing records and the step graph."""
    _, result = doit(ws, "timings", f"target={target}")
    lines = result.stdout.splitlines()
    for i, line in enumerate(lines):
        found = PATH_LINE.search(line)
        if found:
            return float(found[1]), float(found[2]), lines[i + 1:]
    raise SystemExit(f"cluster bench: `doit timings` in {ws} printed no critical path "
                     f"({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")


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
                                  "--no-nanny", "--name", f"w{i}", "--no-dashboard",
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


def public_models(source: Path, only: list[str] | None, staging: Path) -> tuple[Path, list[str]]:
    """The public model files through `doit new` as a user would (bench/public_models.py's
    shapes and hand edits): the models folder, and the files `doit new` refused."""
    from bench.public_models import SHAPES, hand_edits, short
    (staging / "models").mkdir(parents=True)
    refused = []
    for f in sorted(p for p in source.iterdir() if p.suffix in (".onnx", ".tflite")
                    and (not only or any(o in p.name for o in only))):
        shapes = [f"shape={s}" for s in SHAPES.get(f.name.split("__", 1)[-1], [])]
        _, made = doit(staging, "new", f"source={f}", f"name={short(f)}", *shapes)
        if made.returncode != 0:
            refused.append(f"{f.name}: {(made.stdout + made.stderr).strip().splitlines()[-1][:160]}")
            continue
        hand_edits(staging / "models" / short(f) / "model.yaml", f)
    return staging / "models", refused


def bench_set(name: str, models, tmp: Path, cluster: Cluster, args) -> dict:
    """Build one set of models locally and on the cluster; print and return the figures."""
    local, remote = tmp / name / "local", tmp / name / "cluster"
    for ws in (local, remote):
        models(ws / "models")
    count = sum(1 for p in (local / "models").glob("*/model.yaml"))
    url = args.url or f"file://{tmp / name / 'cache'}"
    print(f"\n== {name}: {count} models, target {args.target}", flush=True)

    local_s, local_result = build(local, args.target, options=("-n", "1"))
    ran_here = executed(local_result)
    print(f"local  (doit -n 1): {local_s:8.1f} s, {len(ran_here)} tasks, exit {local_result.returncode}",
          flush=True)
    path_s, work_s, chain = critical_path(local, args.target)
    print(f"critical path: {path_s:.1f} s of {work_s:.1f} s of step time "
          f"({work_s / path_s:.1f}x: the most machines can give)")
    print("\n".join(chain))
    print("  least wall on N machines, max(path, work/N): "
          + ", ".join(f"N={n}: {max(path_s, work_s / n):.0f} s" for n in MACHINES)
          + f", unlimited: {path_s:.0f} s", flush=True)

    cluster_s, cluster_result = build(remote, args.target, "executor=dask",
                                      f"scheduler={cluster.address}", f"cache={url}")
    ran_there = executed(cluster_result)
    print(f"cluster ({args.workers} workers): {cluster_s:8.1f} s, {len(ran_there)} tasks, exit "
          f"{cluster_result.returncode}  ({cluster_s / local_s:.2f}x the local build)")

    records = [json.loads(p.read_text())
               for p in sorted((remote / "artifacts" / "logs").glob("*/*.cluster.json"))]
    logs = sorted(p for p in (remote / "artifacts" / "logs").glob("*/*.log"))
    off_worker = [p.name for p in logs if not p.read_text().startswith("# ran on dask worker")]
    on: dict[str, int] = {}
    for r in records:
        on[r["worker_name"]] = on.get(r["worker_name"], 0) + 1
    starts = [r["started"] - r["submitted"] for r in records]
    print(f"steps on workers: {len(records)} ({', '.join(f'{w}: {n}' for w, n in sorted(on.items()))})")
    print(f"  submission -> start on the worker: {spread(starts)}")
    print(f"  end on the worker -> result here:  {spread([r['returned'] - r['finished'] for r in records])}")
    print(f"  result -> outputs restored here:   {spread([r['restored'] - r['returned'] for r in records])}")
    there = sum(r["finished"] - r["started"] for r in records)
    print(f"  step time on the workers: {there:.1f} s; cluster wall {cluster_s:.1f} s")

    a, b = outputs(local / "artifacts"), outputs(remote / "artifacts")
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"outputs: {len(a)} files, " + ("all byte-identical" if not differ else
                                          f"{len(differ)} differ: {differ[:10]}"))
    problems = []
    if differ:
        problems.append(f"{len(differ)} outputs differ")
    if off_worker:
        problems.append(f"steps whose log names no worker: {off_worker}")
    if local_result.returncode != cluster_result.returncode or ran_here != ran_there:
        problems.append(f"exit {local_result.returncode} here vs {cluster_result.returncode} there; "
                        f"tasks only here {sorted(set(ran_here) - set(ran_there))[:5]}, only there "
                        f"{sorted(set(ran_there) - set(ran_here))[:5]}")
    if local_result.returncode:
        failed = [l for l in (local_result.stdout + local_result.stderr).splitlines()
                  if l.startswith("[model=")]
        print(f"failed here (and there): {len(failed)} step(s)\n  " + "\n  ".join(l[:200] for l in failed))
    for p in problems:
        print(f"PROBLEM: {p}")
    return {"set": name, "models": count, "tasks": len(ran_here), "local_s": local_s,
            "cluster_s": cluster_s, "path_s": path_s, "work_s": work_s,
            "start_median": statistics.median(starts) if starts else 0.0,
            "start_p90": sorted(starts)[int(round(0.9 * (len(starts) - 1)))] if starts else 0.0,
            "files": len(a), "problems": problems}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="host")
    ap.add_argument("--models", type=Path, default=REPO / "models")
    ap.add_argument("--models-from", type=Path, default=None,
                    help="a folder of public model files (../shared/models): a second set")
    ap.add_argument("--only", nargs="*", default=None, help="--models-from files whose name has one of these")
    ap.add_argument("--no-default", action="store_true", help="leave out the --models set")
    ap.add_argument("--tiny", type=int, default=0, help="N tiny test models instead of the sets above")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--url", default=None, help="the remote cache (default: a file:// folder per set)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()

    with temporary("modelyard-cluster-bench-", args.keep) as tmp:
        sets = []
        if args.tiny:
            sys.path.insert(0, str(REPO / "tests"))
            from conftest import add_tiny_model
            sets.append(("tiny", lambda dest: [add_tiny_model(dest, f"tiny{i}", seed=100 + i)
                                               for i in range(args.tiny)]))
        else:
            if not args.no_default:
                sets.append(("default", lambda dest: shutil.copytree(args.models, dest)))
            if args.models_from:
                folder, refused = public_models(args.models_from, args.only, tmp / "staging")
                for line in refused:
                    print(f"left out, `doit new` refused it: {line}")
                sets.append(("public", lambda dest: shutil.copytree(folder, dest)))
        cluster = Cluster(tmp / "dask", args.workers)
        try:
            rows = [bench_set(name, models, tmp, cluster, args) for name, models in sets]
        finally:
            cluster.stop()

    print(f"\n| set | models | tasks | local -n 1 | cluster, {args.workers} workers | submission -> start "
          f"(median, p90) | critical path of step time | least on " + ", ".join(f"{n}" for n in MACHINES)
          + " machines |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['set']} | {r['models']} | {r['tasks']} | {r['local_s']:.0f} s | {r['cluster_s']:.0f} s "
              f"({r['cluster_s'] / r['local_s']:.2f}x) | {r['start_median']:.3f} s, {r['start_p90']:.2f} s | "
              f"{r['path_s']:.0f} s of {r['work_s']:.0f} s | "
              + ", ".join(f"{max(r['path_s'], r['work_s'] / n):.0f} s" for n in MACHINES) + " |")
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
