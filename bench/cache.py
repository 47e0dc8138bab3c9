"""What a shared build cache saves a CI runner that starts from a clean clone.

    python bench/cache.py [--target rk3588] [--models DIR] [--url URL] [--keep]

In a temporary folder (never the user's artifacts/), with a copy of the models (default: the
repository's models/) and an empty remote cache (default: a file:// folder; --url points at a
real server, e.g. an nginx with WebDAV PUT or a bazel-remote, which should start empty):

  1. cold: an empty artifacts folder builds `doit build target=T cache=URL cache_push=1`
     (a trusted runner: it builds everything and pushes it);
  2. warm remote: a second, empty artifacts folder (a fresh clone) builds the same, pull-only:
     every step comes from the remote, no compiler or validation runs;
  3. no-op: the same build again in that folder (nothing to do);
  4. remote down: a third empty folder builds with cache=http://127.0.0.1:<closed port>: the
     build warns once, works cold, and its artifacts must equal the cold build's byte for byte.

Prints each time, the warm/cold ratio (the goal: at most 10 %), the steps each build executed
(tasks that ran a tool, restored, or were already fresh: from doit's output and the step
records), and the objects and bytes moved (`doit cache status`). Exits 1 if the warm build ran
a compile or validation, or if the cache-down build's artifacts differ from the cold build's.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import doit, executed, temporary  # noqa: E402 (after the path is set)
TOOL_STAGES = ("iree_compile", "tvm_compile", "tvm_tune", "validate")
BOOKKEEPING = {".doit.db", ".cache", "logs", ".tmp", ".lock", ".store"}


def build(ws: Path, target: str, *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    elapsed, result = doit(ws, "build", f"target={target}", *extra)
    if result.returncode != 0:
        raise SystemExit(f"cache bench: the build in {ws} failed ({result.returncode}):\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed, result


def logged(ws: Path, since: float) -> list[str]:
    """Steps that ran their stage (a step writes its log only when it runs, not on a restore)."""
    logs = ws / "artifacts" / "logs"
    return sorted(f"{p.parent.name}:{p.stem}" for p in logs.rglob("*.log") if p.stat().st_mtime >= since)


def artifacts_digest(ws: Path) -> dict[str, str]:
    root = ws / "artifacts"
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in BOOKKEEPING}


def status(ws: Path) -> dict:
    """The build's cache figures (what `doit cache status` prints)."""
    from pipeline.core.remote import read_stats
    return read_stats(ws / "artifacts") or {}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once we return: connections are refused


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--url", default=None, help="remote cache URL (default: file:// in the "
                                                    "temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)

    with temporary("modelyard-cache-bench-", args.keep) as tmp:
        url = args.url or (tmp / "remote").as_uri()
        spaces = {}
        for name in ("cold", "warm", "down"):
            spaces[name] = tmp / name
            shutil.copytree(args.models, spaces[name] / "models")
        print(f"cache bench: target {args.target}, models {', '.join(sorted(p.parent.name for p in (spaces['cold'] / 'models').glob('*/model.yaml')))}, "
              f"remote {url}; temporary folder {tmp}")

        t0 = time.time()
        cold, cold_run = build(spaces["cold"], args.target, f"cache={url}", "cache_push=1")
        cold_stats = status(spaces["cold"])
        t1 = time.time()
        warm, warm_run = build(spaces["warm"], args.target, f"cache={url}")
        warm_stats = status(spaces["warm"])
        warm_logged = logged(spaces["warm"], t1)
        noop, noop_run = build(spaces["warm"], args.target, f"cache={url}")
        down_url = f"http://127.0.0.1:{closed_port()}/cache"
        down, down_run = build(spaces["down"], args.target, f"cache={down_url}")

        print("\n| build | wall time | tasks executed | steps that ran a tool |")
        print("| --- | --- | --- | --- |")
        print(f"| cold, pushing | {cold:.1f} s | {len(executed(cold_run))} | {len(logged(spaces['cold'], t0))} |")
        print(f"| warm remote, fresh folder | {warm:.1f} s ({warm / cold:.1%} of cold) | "
              f"{len(executed(warm_run))} | {len(warm_logged)} |")
        print(f"| no-op | {noop:.2f} s | {len(executed(noop_run))} | 0 |")
        print(f"| remote down, fresh folder | {down:.1f} s | {len(executed(down_run))} | "
              f"{len(logged(spaces['down'], t0))} |")
        pushed, pulled = cold_stats.get("counts", {}), warm_stats.get("counts", {})
        print(f"\ncold build pushed {pushed.get('records_pushed', 0)} key records and "
              f"{pushed.get('objects_pushed', 0)} objects, {pushed.get('bytes_pushed', 0) / 2**20:.1f} MiB")
        print(f"warm build pulled {pulled.get('remote_hits', 0)} of {pulled.get('lookups', 0)} steps "
              f"from the remote: {pulled.get('objects_pulled', 0)} objects, "
              f"{pulled.get('bytes_pulled', 0) / 2**20:.1f} MiB; damaged {pulled.get('damaged', 0)}, "
              f"rejected records {pulled.get('rejected', 0)}")
        warned = [l for l in down_run.stderr.splitlines() if "cache" in l.lower()]
        print(f"remote down: {len(warned)} warning line(s): {warned[:2]}")

        problems = []
        tools = [s for s in warm_logged if s.split(":")[0] in TOOL_STAGES]
        if tools:
            problems.append(f"the warm build ran {tools}")
        cold_bytes, down_bytes = artifacts_digest(spaces["cold"]), artifacts_digest(spaces["down"])
        warm_bytes = artifacts_digest(spaces["warm"])
        for name, other in (("warm", warm_bytes), ("remote-down", down_bytes)):
            differ = sorted(k for k in cold_bytes.keys() | other.keys() if cold_bytes.get(k) != other.get(k))
            print(f"{name} build vs cold build: {len(cold_bytes) - len(differ)} of {len(cold_bytes)} "
                  f"files byte-identical" + (f"; differ: {differ[:5]}" if differ else ""))
            if differ:
                problems.append(f"the {name} build's files differ from the cold build's: {differ[:5]}")
        if warm > 0.10 * cold:
            print(f"note: warm remote took {warm / cold:.1%} of the cold build (goal: at most 10 %)")
        for p in problems:
            print(f"FAIL: {p}")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
