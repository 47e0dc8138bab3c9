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

A model's tuning budget and pinned database (pipeline/stages/tvm_tune.py):

    tvm:
      tune: {host: {trials: 108, per_task: 2, in_build: false}}
      database: {host: tuning/host}
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import unknown_keys

DATABASE = ("database_workload.json", "database_tuning_record.json")
DATABASE_FILES = (*DATABASE, "tune.json")   # what a pinned database folder holds
_ARCHES = {"aarch64": ("aarch64-linux-gnu", "aarch64-linux-gnu-g++"),
           "x86_64": ("x86_64-linux-gnu", "g++")}
_KEYS = {"compiler", "arch", "triple", "cpu", "cpu_features", "num_cores", "run", "tune"}
_RUN_KEYS = {"via", "qemu_cpu"}
_TUNE_KEYS = {"trials", "per_task", "in_build"}
_FARM_KEYS = {"tracker", "key"}
_TVM_KEYS = {"tune", "database"}


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


def parse_abi(name: str, body: dict, where: str, problems: list) -> TvmAbi | None:
    """A `compiler: tvm` ABI of a target YAML; problems are appended, one sentence each."""
    before = len(problems)
    for key in sorted(set(body) - _KEYS):
        problems.append(f"{where}: unknown key {key!r} for a TVM ABI (allowed: "
                        f"{', '.join(sorted(_KEYS))})")
    arch = body.get("arch")
    if arch not in _ARCHES:
        problems.append(f"{where}.arch: expected one of {', '.join(_ARCHES)}, got {arch!r}")
    cpu = body.get("cpu")
    if not isinstance(cpu, str) or not cpu:
        problems.append(f"{where}: missing required key 'cpu' (an LLVM CPU name, e.g. cortex-a55)")
    features = body.get("cpu_features", [])
    if not isinstance(features, list) or not all(isinstance(f, str) and f[:1] in "+-" for f in features):
        problems.append(f"{where}.cpu_features: expected a list of LLVM attributes such as '+neon'")
    cores = body.get("num_cores", 1)
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        problems.append(f"{where}.num_cores: expected a positive integer, got {cores!r}")
    run = body.get("run")
    if not isinstance(run, dict):
        problems.append(f"{where}.run: expected a mapping saying how to run the artifact here")
        run = {}
    unknown_keys(problems, f"{where}.run", run, _RUN_KEYS)
    via = run.get("via")
    if via not in ("python", "qemu"):
        problems.append(f"{where}.run.via: expected 'python' (this machine's TVM runtime) or 'qemu' "
                        f"(the aarch64 TVM runtime under qemu-user), got {via!r}")
    elif via == "qemu" and arch != "aarch64":
        problems.append(f"{where}.run.via: qemu runs aarch64 artifacts only (arch is {arch!r})")
    elif via == "python" and arch != "x86_64":
        problems.append(f"{where}.run.via: python runs this machine's (x86_64) artifacts only")
    tune = body.get("tune", {})
    if not isinstance(tune, dict):
        problems.append(f"{where}.tune: expected a mapping with tracker and key")
        tune = {}
    for key in sorted(set(tune) - _FARM_KEYS):
        problems.append(f"{where}.tune: unknown key {key!r} (allowed: tracker, key)")
    if "tracker" in tune and not _is_address(tune["tracker"]):
        problems.append(f"{where}.tune.tracker: expected HOST:PORT, got {tune['tracker']!r}")
    if len(problems) > before:
        return None
    run_cfg = {"via": via, "device": "cpu"}
    if via == "qemu":
        run_cfg["qemu_cpu"] = str(run.get("qemu_cpu", "max"))
    return TvmAbi(name=name, arch=arch, triple=str(body.get("triple", _ARCHES[arch][0])),
                  cpu=cpu, cpu_features=tuple(features), num_cores=cores, run=run_cfg,
                  tune={k: str(v) for k, v in tune.items()})


def _is_address(value) -> bool:
    host, _, port = str(value).rpartition(":")
    return bool(host) and port.isdigit()


def parse_model(raw, model_dir: Path, where: str, problems: list) -> dict:
    """A model's `tvm:` section -> {"tune": {target: {...}}, "database": {target: Path}}."""
    out = {"tune": {}, "database": {}}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        problems.append(f"{where}: tvm: expected a mapping with tune and/or database")
        return out
    unknown_keys(problems, f"{where}: tvm", raw, _TVM_KEYS)
    tune = raw.get("tune") or {}
    if not isinstance(tune, dict):
        problems.append(f"{where}: tvm.tune: expected a mapping of target -> {{trials, per_task}}")
        tune = {}
    for target, body in tune.items():
        tw = f"{where}: tvm.tune.{target}"
        if isinstance(body, int) and not isinstance(body, bool):
            body = {"trials": body}
        if not isinstance(body, dict):
            problems.append(f"{tw}: expected {{trials: N, per_task: K}} or a number of trials")
            continue
        unknown_keys(problems, tw, body, _TUNE_KEYS)
        trials, per_task = body.get("trials", 0), body.get("per_task", body.get("trials", 0))
        for name, value in (("trials", trials), ("per_task", per_task)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{tw}.{name}: expected a whole number >= 0, got {value!r}")
        if not isinstance(body.get("in_build", False), bool):
            problems.append(f"{tw}.in_build: expected true or false")
        if isinstance(trials, int) and trials > 0:
            out["tune"][str(target)] = {"trials": trials, "per_task": max(1, min(per_task, trials)),
                                        "in_build": bool(body.get("in_build", False))}
    pins = raw.get("database") or {}
    if not isinstance(pins, dict):
        problems.append(f"{where}: tvm.database: expected a mapping of target -> folder")
        pins = {}
    for target, folder in pins.items():
        path = (model_dir / str(folder)).resolve()
        missing = [n for n in DATABASE_FILES if not (path / n).is_file()]
        if missing:
            problems.append(f"{where}: tvm.database.{target}: {path} lacks {', '.join(missing)}")
        elif str(target) not in out["tune"]:
            problems.append(f"{where}: tvm.database.{target}: a pinned database needs a budget "
                            f"(tvm.tune.{target}) to say what it was tuned with")
        else:
            out["database"][str(target)] = path
    return out
