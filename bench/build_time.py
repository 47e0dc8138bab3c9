"""A new user's first build, timed: cold, then with only a warm shader cache.

    python bench/build_time.py [--target rk3588] [--models DIR] [--keep]

In a temporary folder (never the user's artifacts/), with a copy of the models (default: the
repository's models/), as a fresh clone would run README command 1:

  1. cold: `doit build target=T` into an empty artifacts folder, with an empty store, no remote
     cache and an empty machine-wide shader cache ($MODELYARD_SHADER_CACHE points into the
     temporary folder, so nothing of this machine's own caches is used);
  2. warm shaders: the same build into a second empty artifacts folder; only the shader cache the
     first build filled is kept (what a CI runner or a second machine has once the packs come
     from the remote cache). Every step runs again; every Vulkan validation still runs and
     compares, only lavapipe's kernel compilation is skipped.

Prints both wall times, the slowest steps and the time per stage of each (from the steps' own
records, `doit timings`), where the Vulkan validations' time went (per run, from the line
pipeline/run/iree_run.py writes to the step's log, which calls the model a second time for this
benchmark ($MODELYARD_VULKAN_SECOND_CALL): kernel compile = first call - second call (lavapipe
compiles a kernel at its first dispatch, or reads it from its shader cache), execution = the
second call, loading the module, and the CPU seconds of the threads the spin watcher demoted),
the CPU kind Mesa keys its cache on, and whether the two builds' outputs
are byte-identical. Exits 1 if a build fails or any output differs.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import executed, temporary  # noqa: E402 (after the path is set)
from bench.overhead import outputs  # noqa: E402
from pipeline.run.iree_run import SECOND_CALL, SPLIT  # noqa: E402
from pipeline.run.shader_packs import cpu_kind, describe_kind  # noqa: E402

_SPLIT = re.compile(re.escape(SPLIT) + r" load ([0-9.]+) s, first call ([0-9.]+) s"
                    r"(?:, second call ([0-9.]+) s)?, spinning threads ([0-9.]+) CPU s")
FIELDS = ("kernel compile", "execution", "load", "spin CPU")


def build(models: Path, artifacts: Path, target: str, env: dict,
          jobs: int | None = None) -> tuple[float, list[str]]:
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"),
            *(("-n", str(jobs)) if jobs else ()), "build", f"target={target}",
            f"models={models}", f"artifacts={artifacts}"]
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"build_time: {' '.join(argv)} failed ({result.returncode}):\n"
                         f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return wall, executed(result)


def timings(models: Path, artifacts: Path, target: str, env: dict) -> str:
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "timings",
            f"target={target}", f"models={models}", f"artifacts={artifacts}"]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env).stdout


def vulkan_split(artifacts: Path) -> dict[str, tuple[float, ...]]:
    """Per validation step log: FIELDS in seconds, summed over its Vulkan runs (a run without a
    second call counts its whole first call as execution: nothing tells the compile apart)."""
    out = {}
    for log in sorted((artifacts / "logs").glob("validate*/*.log")):
        runs = []
        for m in _SPLIT.finditer(log.read_text(errors="replace")):
            load, first, second, spin = (float(g) if g else None for g in m.groups())
            second = first if second is None else second
            runs.append((max(first - second, 0.0), second, load, spin))
        if runs:
            out[log.stem] = tuple(sum(r[i] for r in runs) for i in range(len(FIELDS)))
    return out


def split_table(phases: dict[str, dict[str, tuple[float, ...]]]) -> str:
    """The Vulkan validations of each phase side by side, FIELDS in seconds."""
    steps = sorted({s for split in phases.values() for s in split})
    head = ("| validation | " + " | ".join(f"{p}: {' / '.join(FIELDS)} s" for p in phases) + " |")
    rows = [head, "| --- |" + " --- |" * len(phases)]
    for step in steps + ["total"]:
        cells = []
        for split in phases.values():
            v = (tuple(sum(x[i] for x in split.values()) for i in range(len(FIELDS)))
                 if step == "total" else split.get(step))
            cells.append(" / ".join(f"{x:.1f}" for x in v) if v else "-")
        rows.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--models", type=Path, default=REPO / "models",
                        help="models folder to copy (default: the repository's models/)")
    parser.add_argument("--jobs", type=int, help="doit -n N (default 1, doit build's own)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)

    with temporary("modelyard-build-time-", args.keep) as tmp:
        models = tmp / "models"
        shutil.copytree(args.models, models)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONDONTWRITEBYTECODE", "MODELYARD_CACHE", "MODELYARD_CACHE_PUSH")}
        env["MODELYARD_SHADER_CACHE"] = str(tmp / "shader-cache")
        env[SECOND_CALL] = "1"  # each Vulkan run calls the model twice: compile = first - second
        print(f"build_time: CPU kind (Mesa's cache key) {describe_kind(cpu_kind())}", flush=True)
        print(f"build_time: target {args.target}, models "
              f"{', '.join(sorted(p.parent.name for p in models.glob('*/model.yaml')))}; "
              f"{os.cpu_count()} cores, doit -n {args.jobs or 1}; temporary folder {tmp}",
              flush=True)

        walls = {}
        for phase in ("cold", "warm shaders"):
            artifacts = tmp / f"artifacts-{phase.replace(' ', '-')}"
            walls[phase], ran = build(models, artifacts, args.target, env, args.jobs)
            print(f"\n== {phase}: {walls[phase]:.1f} s wall, {len(ran)} tasks ==", flush=True)
            print(timings(models, artifacts, args.target, env), flush=True)

        print("Vulkan validations (kernel compile: the shader cache read when warm):")
        print(split_table({phase: vulkan_split(tmp / f"artifacts-{phase.replace(' ', '-')}")
                           for phase in walls}))
        cold, warm = (outputs(tmp / "artifacts-cold"), outputs(tmp / "artifacts-warm-shaders"))
        differ = sorted(k for k in set(cold) | set(warm) if cold.get(k) != warm.get(k))
        print(f"cold build:              {walls['cold']:7.1f} s")
        print(f"with warm shader cache:  {walls['warm shaders']:7.1f} s "
              f"({walls['warm shaders'] / walls['cold']:.2f}x of cold)")
        print(f"outputs: {len(cold) - len(differ)} of {len(cold)} files byte-identical"
              + (f"; differ: {differ[:10]}" if differ else ""))
        return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
