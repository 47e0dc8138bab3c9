"""What the tvm_tune stage, `doit tune` and the tuning child agree on: a database's identity
(what it was tuned for), the child's exit codes and progress prefix, and the search's sizes.

A name table without TVM: the stage, the command and the child import it at no cost.
"""
from __future__ import annotations

import json

from ..core.tools import distribution_version
from .tvm_relax import Budget

TRIALS_PER_ITER = 8
BUILDER_TIMEOUT_S = 300  # a single kernel builds in ~2 s, but a loaded 2-core machine needs slack
SEED = 0
# MetaSchedule's evolutionary search samples a population of candidate schedules per task and
# evolves it with the cost model before measuring the best few; its default, 512, is sized for
# hundreds of trials per task. For the few trials per task of these budgets it costs minutes per
# trial on 2 cores (a ppocr_det kernel: 30 s to sample 512, then ~40 s per evolution round):
# the population scales with the per-task budget instead, within MetaSchedule's default.
POPULATION_PER_TRIAL, POPULATION_MIN, POPULATION_MAX = 32, 64, 512
PROGRESS = "[tune] "  # the tuning child's progress lines start with it
NOT_COVERED = 4       # the child's exit code: the pinned database does not cover the budget
CLUSTER_FAILED = 5    # the child's exit code: the Dask cluster could not build the candidates


def search_population(per_task: int) -> int:
    return max(POPULATION_MIN, min(POPULATION_MAX, POPULATION_PER_TRIAL * per_task))


def tvm_versions() -> dict:
    return {d: distribution_version(d) for d in ("apache-tvm", "apache-tvm-ffi")}


def identity(static_sha256: str, target: dict, budget: Budget) -> dict:
    """What a database is for: a model's pinned one must match this exactly to be applied."""
    return {"static_model_sha256": static_sha256, "target": target, "tvm": tvm_versions(),
            "trials": budget.trials, "per_task": budget.per_task}


def database_identity(target: dict) -> dict:
    """What a shared database is for: the records of every model of one TVM target and version."""
    return {"target": target, "tvm": tvm_versions()}


def identity_problems(have: dict, want: dict) -> list[str]:
    labels = {"static_model_sha256": "static model", "target": "TVM target", "tvm": "TVM version",
              "trials": "trial budget", "per_task": "per-task budget"}
    return [f"{labels[key]}: the database has {json.dumps(have.get(key), sort_keys=True)}, this "
            f"build needs {json.dumps(want[key], sort_keys=True)}"
            for key in want if have.get(key) != want[key]]


def child_summary(result) -> dict:
    return json.loads([l for l in result.output.splitlines() if l.startswith("{")][-1])
