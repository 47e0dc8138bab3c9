"""The TVM sections of the specs: a target's `compiler: tvm` ABIs and a model's `tvm:` section.

A TVM ABI is declared in the target's YAML next to the IREE ones, with `compiler: tvm`:

    cpu-aarch64-tvm:
      compiler: tvm
      arch: aarch64                 # aarch64 | x86_64
      triple: aarch64-linux-gnu     # default from arch
      cpu: cortex-a55               # LLVM -mcpu
      cpu_features: [+neon]         # LLVM -mattr
      num_cores: 4                  # MetaSchedule's parallelism hint
      run: {via: qemu, qemu_cpu: cortex-a76}    # or {via: python} for x86_64
      tune: {tracker: 127.0.0.1:9190, key: rk3588}   # optional: where `doit tune` measures

A model's tuning budget (pipeline/stages/tvm_tune.py, docs/tuning.md):

    tvm:
      tune: {host: {trials: 108, per_task: 2, in_build: false}}
      database: {host: tuning/host}     # optional: a database pinned for this model alone

The shared pinned database of a TVM ABI, every model's (records keyed by workload, reused by
every model with the same kernels), lives in the models folder, in no model's (a dot folder is
no model: the spec loader skips it):

    models/.tuning/<target>/<abi>/  database_workload.json, database_tuning_record.json,
                                    database.json (TVM target and versions, dry workloads)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag

from .common import Doc, Says, check_via, inside, links_out

DATABASE = ("database_workload.json", "database_tuning_record.json")
DATABASE_FILES = (*DATABASE, "tune.json")   # what a pinned database folder holds
SHARED_DATABASE_FILES = (*DATABASE, "database.json")   # what the shared pinned database holds
SHARED_DATABASE_DIR = ".tuning"                          # in the models folder
_ARCHES = {"aarch64": ("aarch64-linux-gnu", "aarch64-linux-gnu-g++"),
           "x86_64": ("x86_64-linux-gnu", "g++")}


@dataclass(frozen=True)
class TvmAbi:
    """One TVM build of a model for a target: an LLVM CPU target, and how to run it here."""
    name: str
    arch: str
    triple: str
    cpu: str
    cpu_features: tuple[str, ...]
    num_cores: int
    run: dict                       # {"via": "python"|"qemu", "device": "cpu", "qemu_cpu": ...}
    tune: dict = field(default_factory=dict)   # {"tracker": "host:port", "key": "rk3588"}
    compiler: str = "tvm"
    backend: str = "llvm"           # TVM's target kind
    flags: tuple = ()
    configs: tuple = ()             # a TVM ABI has no `configs:` (doit search builds it as is)
    configs_from: str | None = None

    def target_dict(self) -> dict:
        target = {"kind": "llvm", "mtriple": self.triple, "mcpu": self.cpu,
                  "num-cores": self.num_cores}
        if self.cpu_features:
            target["mattr"] = list(self.cpu_features)
        return target

    @property
    def cross_compiler(self) -> str:
        """The C++ driver that links the .so (export_library's fcompile)."""
        return _ARCHES[self.arch][1]

    def compile_config(self) -> dict:
        return {"compiler": "tvm", "backend": "llvm", "arch": self.arch, "triple": self.triple,
                "cpu": self.cpu, "cpu_features": list(self.cpu_features),
                "num_cores": self.num_cores, "target": self.target_dict(),
                "linker": self.cross_compiler}


# ----------------------------------------------------------------------------- target
class TvmRunDoc(Doc):
    """How the artifact is run here to validate it."""
    via: Literal["python", "qemu"]
    """python: this machine's TVM runtime (x86_64); qemu: the aarch64 TVM runtime under qemu-user"""
    qemu_cpu: str = None
    """qemu's -cpu (default max)"""


class FarmDoc(Doc):
    """Where `doit tune` measures: boards registered with an RPC tracker."""
    tracker: Annotated[str, Field(pattern=r"^.+:[0-9]+$"), Says("expected HOST:PORT, got {input}")] = None
    key: str = None
    """the boards' key at the tracker"""


class TvmAbiDoc(Doc):
    """An ABI built by TVM (Relax -> a .so) for an LLVM CPU target."""
    compiler: Literal["tvm"]
    arch: Literal[tuple(_ARCHES)]
    triple: str = None
    """default from arch"""
    cpu: Annotated[str, Field(min_length=1)]
    """LLVM -mcpu, e.g. cortex-a55"""
    cpu_features: list[Annotated[str, Field(pattern=r"^[+-]"), Says(
        "expected an LLVM attribute such as '+neon', got {input}")]] = []
    """LLVM -mattr"""
    num_cores: Annotated[int, Field(ge=1)] = 1
    """MetaSchedule's parallelism hint"""
    run: TvmRunDoc
    tune: Optional[FarmDoc] = None


def parse_abi(name: str, doc: TvmAbiDoc, where: str, problems: list) -> TvmAbi | None:
    """A `compiler: tvm` ABI of a target YAML; problems are appended, one sentence each."""
    run = doc.run
    if run is None or not check_via(doc.arch, run.via, where, problems) or None in (
            doc.arch, doc.cpu, doc.cpu_features, doc.num_cores):
        return None
    run_cfg = {"via": run.via, "device": "cpu"}
    if run.via == "qemu":
        run_cfg["qemu_cpu"] = run.qemu_cpu or "max"
    return TvmAbi(name=name, arch=doc.arch, triple=doc.triple or _ARCHES[doc.arch][0],
                  cpu=doc.cpu, cpu_features=tuple(doc.cpu_features), num_cores=doc.num_cores,
                  run=run_cfg, tune=doc.tune.model_dump(exclude_none=True) if doc.tune else {})


def shared_database(models_dir: Path, target: str, abi: str) -> Path:
    """The shared pinned database of a TVM ABI, `.tuning/<target>/<abi>/` in the models folder
    (whatever reads the models folder, the no-op build's fingerprint included, sees it), whether
    or not it exists yet."""
    return Path(models_dir) / SHARED_DATABASE_DIR / target / abi


# ----------------------------------------------------------------------------- model.yaml
class TuneDoc(Doc):
    """A MetaSchedule budget."""
    trials: Annotated[int, Field(ge=0)] = 0
    """in all (0: not tuned)"""
    per_task: Annotated[int, Field(ge=0)] = None
    """at most this many per task (default: trials)"""
    in_build: bool = False
    """tune during `doit build` (default: only `doit tune` tunes)"""


Budget = Annotated[Union[Annotated[int, Field(ge=0), Tag("trials")],
                         Annotated[TuneDoc, Tag("budget")]],
                   Discriminator(lambda v: "budget" if isinstance(v, dict) else "trials")]


class TvmDoc(Doc):
    """The model's TVM tuning budgets and pinned tuning databases, per target."""
    tune: Optional[dict[str, Budget]] = None
    """target -> {trials, per_task, in_build}, or a number of trials"""
    database: Optional[dict[str, str]] = None
    """target -> a folder (relative to the model folder, inside it) holding the database
    `doit tune ... pin=1` made"""


def parse_model(doc: TvmDoc | None, model_dir: Path, where: str, problems: list) -> dict:
    """A model's `tvm:` section -> {"tune": {target: {...}}, "database": {target: Path}}."""
    out = {"tune": {}, "database": {}}
    for target, body in ((doc.tune if doc else None) or {}).items():
        body = TuneDoc(trials=body) if isinstance(body, int) else body
        if body is not None and body.trials and body.in_build is not None:
            per_task = body.trials if body.per_task is None else body.per_task
            out["tune"][target] = {"trials": body.trials,
                                   "per_task": max(1, min(per_task, body.trials)),
                                   "in_build": body.in_build}
    for target, folder in ((doc.database if doc else None) or {}).items():
        if folder is None:
            continue
        dw = f"{where}: tvm.database.{target}"
        path = inside(model_dir, folder, dw, problems)
        if path is None:
            continue
        missing = [n for n in DATABASE_FILES if not (path / n).is_file()]
        if missing:
            problems.append(f"{dw}: {path} lacks {', '.join(missing)}")
        elif target not in out["tune"]:
            problems.append(f"{dw}: a pinned database needs a budget "
                            f"(tvm.tune.{target}) to say what it was tuned with")
        elif links_out(model_dir, [path / n for n in DATABASE_FILES], dw, problems):
            out["database"][target] = path
    return out


def budget(model, target) -> dict | None:
    """A model's tuning budget on a target ({trials, per_task, in_build}), None if it has none."""
    return model.tvm.get("tune", {}).get(target.name)
