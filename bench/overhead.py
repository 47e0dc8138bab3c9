"""The pipeline's own speed: what modelyard costs on top of the tools it runs.

    python bench/overhead.py [--runs 5] [--models DIR] [--model NAME] [--target host] [--keep]

Prints, for a copy of the models (default: the repository's models/) built into a fresh
temporary artifacts folder (never the user's):
  1. bare `doit --version` vs a no-op `doit build` (median of --runs runs each): the cost of
     loading dodo.py, validating the specs and asking every step whether it is up to date;
  2. the cold build time of those models for --target (empty artifacts folder, empty store) with
     `doit -n 1`, and with --jobs N (default 2; `doit build` runs one step per core unless told)
     the same cold build run by `doit -n N` in another empty folder: both wall times, and whether
     every output is byte-identical;
  3. the tasks re-run after a one-model spec edit (--model's first input: its last dim changes),
     next to that model's chain as the build graph predicts it: the steps whose own fingerprint
     the edit changed, and every step downstream of them. They must be equal: an extra task is
     wasted work, a missing one a stale artifact. Exits 1 when they differ.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import executed as ran, temporary  # noqa: E402 (after the path is set)


def doit(*args: str, models: Path | None = None, artifacts: Path | None = None,
         check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    argv = [sys.executable, "-m", "doit", *args]
    if models is not None:
        argv[3:3] = ["-f", str(REPO / "dodo.py")]
        argv += [f"models={models}", f"artifacts={artifacts}"]
    # as a user runs it: Python's bytecode cache on (some CI shells turn it off)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env)
    elapsed = time.perf_counter() - start
    if check and result.returncode != 0:
        raise SystemExit(f"overhead: {' '.join(argv)} failed ({result.returncode}):\n"
                         f"{result.stdout}\n{result.stderr}")
    return elapsed, result


# written by a build besides its outputs: doit's db, caches, logs, scratch, the lock, the store
BOOKKEEPING = {".doit.db", ".cache", "logs", ".tmp", ".lock", ".store"}


def outputs(artifacts: Path) -> dict[str, bytes]:
    return {p.relative_to(artifacts).as_posix(): p.read_bytes() for p in sorted(artifacts.rglob("*"))
            if p.is_file() and p.relative_to(artifacts).parts[0] not in BOOKKEEPING}


def edit_spec(spec: Path, signature: dict) -> str:
    """Rebind a dynamic dim of the first input: the last one (a new resolution: -32) when it is
    dynamic, else the first (batch: x2). Returns what changed."""
    doc = yaml.safe_load(spec.read_text())
    name, entry = next(iter(doc["inputs"].items()))
    dims = next(i["dims"] for i in signature["inputs"] if i["name"] == name)
    dynamic = [k for k, d in enumerate(dims) if not isinstance(d, int)]
    if not dynamic:
        raise SystemExit(f"overhead: input {name} of {spec.parent.name} has no dynamic dim to "
                         f"rebind; pick another --model")
    k = len(dims) - 1 if len(dims) - 1 in dynamic else dynamic[0]
    old = list(entry["shape"])
    entry["shape"][k] = old[k] - 32 if k == len(dims) - 1 and old[k] > 32 else old[k] * 2
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f"input {name} {old} -> {entry['shape']}"


def model_to_edit(models) -> str | None:
    """The first model (not a variant) with a dynamic dim to rebind, preferably one that no
    variant derives from: an int8 variant may rightly fail its accuracy gate at another shape
    (ppocr_cls.int8 at 48x160), and a failed build re-runs less than the chain."""
    rebindable = [m.name for m in models if "." not in m.name and any(
        not isinstance(d, int) for i in m.signature["inputs"] for d in i["dims"])]
    alone = [n for n in rebindable if not any(m.name.startswith(f"{n}.") for m in models)]
    return next(iter(alone + rebindable), None)


def predicted_chain(models: Path, artifacts: Path, target: str, before: dict) -> list[str]:
    """doit tasks the edit must re-run: fingerprint changed, or downstream of one that did."""
    from pipeline.graph import load_project
    from pipeline.core.store import _memo
    after = _steps(load_project(models, artifacts, target))
    _memo.save()  # now, while the temporary folder still exists
    dirty = {task for task, (fp, _, _) in after.items() if before.get(task, (None,))[0] != fp}
    changed = True
    while changed:  # propagate along files: a step reading an output of a dirty step is dirty
        produced = {path for task in dirty for path in after[task][2]}
        grown = dirty | {task for task, (_, inputs, _) in after.items() if inputs & produced}
        changed, dirty = grown != dirty, grown
    return in_stage_order(dirty)


def in_stage_order(tasks) -> list[str]:
    from pipeline.graph import STAGES
    order = {stage.name: k for k, stage in enumerate(STAGES)}
    return sorted(tasks, key=lambda t: (order.get(t.split(":")[0], len(order)), t))


def _steps(project) -> dict:
    from pipeline.graph import STAGES
    out = {}
    for stage in (s.name for s in STAGES):
        for step in project.steps(stage):
            outputs = {str(step.out_dir / o) for o in step.outputs} | {str(step.record)}
            out[f"{stage}:{step.name}"] = (step.static_fingerprint(),
                                           {str(p) for p in step.inputs.values()}, outputs)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per median (default 5)")
    parser.add_argument("--models", type=Path, default=REPO / "models",
                        help="models folder to copy (default: the repository's models/)")
    parser.add_argument("--model", default=None, help="model whose spec is edited (default: "
                                                      "the first one with a dynamic dim)")
    parser.add_argument("--target", default="host")
    parser.add_argument("--jobs", type=int, default=2, help="the parallel cold build's doit "
                                                            "-n (default 2; 1 skips it)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    from pipeline.graph import load_project

    with temporary("modelyard-overhead-", args.keep) as tmp:
        models, artifacts = tmp / "models", tmp / "artifacts"
        shutil.copytree(args.models, models)
        names = sorted(p.parent.name for p in models.glob("*/model.yaml"))
        model = args.model or names[0]
        target = f"target={args.target}"
        print(f"overhead: {len(names)} model(s) ({', '.join(names)}), target {args.target}, "
              f"medians of {args.runs} runs; temporary folder {tmp}")

        version = [doit("--version")[0] for _ in range(args.runs)]
        cold, first = doit("-n", "1", "build", target, models=models, artifacts=artifacts)
        noop_runs = []
        for _ in range(args.runs):
            elapsed, result = doit("build", target, models=models, artifacts=artifacts)
            if ran(result):
                raise SystemExit(f"overhead: a no-op build ran {ran(result)}")
            noop_runs.append(elapsed)
        med_version, med_noop = statistics.median(version), statistics.median(noop_runs)
        print(f"bare `doit --version`:     {med_version:6.2f} s (median; runs "
              f"{', '.join(f'{v:.2f}' for v in version)})")
        print(f"no-op `doit build`:        {med_noop:6.2f} s (median; runs "
              f"{', '.join(f'{v:.2f}' for v in noop_runs)}); overhead over bare doit "
              f"{med_noop - med_version:+.2f} s, {med_noop / med_version:.2f}x (goal <= 2x)")
        print(f"cold build ({len(ran(first))} tasks):   {cold:6.1f} s")
        if args.jobs > 1:
            parallel_dir = tmp / f"artifacts-n{args.jobs}"
            wall, result = doit("-n", str(args.jobs), "build", target, models=models,
                                artifacts=parallel_dir)
            one, many = outputs(artifacts), outputs(parallel_dir)
            same = sum(1 for k in one if many.get(k) == one[k])
            print(f"cold build, doit -n {args.jobs}: {wall:6.1f} s ({len(ran(result))} tasks), "
                  f"{cold / wall:.2f}x faster than -n 1; {same} of {len(one)} files "
                  f"byte-identical to the -n 1 build"
                  + ("" if same == len(one) == len(many) else
                     f" (only in -n {args.jobs}: {sorted(set(many) - set(one))[:5]})"))
            if same != len(one) or len(many) != len(one):
                differ = sorted(k for k in one if many.get(k) != one[k])
                print(f"  differ: {differ[:10]}")
                return 1

        from pipeline.core.store import _memo
        project = load_project(models, artifacts, args.target)
        before = _steps(project)
        _memo.save()
        if args.model is None:
            model = model_to_edit(project.models) or model
        signature = next(m.signature for m in project.models if m.name == model)
        what = edit_spec(models / model / "model.yaml", signature)
        expected = predicted_chain(models, artifacts, args.target, before)
        elapsed, edited = doit("build", target, models=models, artifacts=artifacts)
        actual = in_stage_order(ran(edited))
        print(f"one-model edit ({model}: {what}): {elapsed:.1f} s, re-ran {len(actual)} task(s):")
        for task in actual:
            print(f"    {task}")
        if actual == expected:
            print(f"  = {model}'s chain as the build graph predicts it: equal")
            return 0
        print(f"  != predicted chain {expected}")
        print(f"  extra: {sorted(set(actual) - set(expected))}; "
              f"missing: {sorted(set(expected) - set(actual))}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
