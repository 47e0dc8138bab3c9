"""Stage `tvm_compile`: static ONNX -> TVM Relax -> a shared library (`model.so`) for one TVM ABI.

    ONNX (static, simplified)  --relax.frontend.onnx-->  Relax  --tvm.compile-->  VM executable
      [--MetaSchedule database (tvm_tune), applied by compile_relax-->]
      --export_library(g++ or aarch64-linux-gnu-g++)-->  model.so (weights embedded, entry `main`)

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

The TVM target is a dict (`target_dict`), never a string (TVM 0.27 rejects "llvm -mcpu=...").
The compile runs in a child process (`python -m pipeline.tvm_compile`): a crash in TVM is an
error of this stage, and TVM's own chatter goes to the step's log. Two compiles of the same
model and target give byte-identical `.so` files (checked by the tests).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import unknown_keys
from .tools import describe_exit, python_module_argv, run_tool, tail

VERSION = 1
OUTPUTS = ("model.so", "compile.json")
FORMAT = "tvm-so"
TOOLS = ("apache-tvm", "apache-tvm-ffi", "onnx")
_ARCHES = {"aarch64": ("aarch64-linux-gnu", "aarch64-linux-gnu-g++"),
           "x86_64": ("x86_64-linux-gnu", "g++")}
_KEYS = {"compiler", "arch", "triple", "cpu", "cpu_features", "num_cores", "run", "tune"}
_RUN_KEYS = {"via", "qemu_cpu"}
_TUNE_KEYS = {"tracker", "key"}


# ----------------------------------------------------------------------------- the ABI
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
    for key in sorted(set(tune) - _TUNE_KEYS):
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


# ----------------------------------------------------------------------------- the stage
def compile_argv(model: Path, config: dict, out: Path, database: Path | None) -> list[str]:
    """The child command that compiles `model` for `config` into `out` (pure: no toolchain)."""
    argv = python_module_argv("pipeline.tvm_compile", "--model", str(model), "--out", str(out),
                              "--target", json.dumps(config["target"], sort_keys=True),
                              "--linker", config["linker"], "--entry", config["entry"])
    if database is not None:
        argv += ["--database", str(database)]
    return argv


def run(ctx) -> None:
    import shutil

    where = dict(stage=ctx.step.stage, **ctx.step.where)
    database = None
    if ctx.config["tuning"]:
        database = ctx.scratch / "database"  # a private copy: TVM's JSONDatabase opens for append
        database.mkdir()
        for name in ("database_workload.json", "database_tuning_record.json"):
            shutil.copyfile(ctx.input(name), database / name)
    so = ctx.output("model.so")
    result = run_tool(compile_argv(ctx.input("model"), ctx.config, so, database), log=ctx.log,
                      what="TVM compile", check=False, timeout=3600, **where)
    if database is not None:
        shutil.rmtree(database)
    if result.returncode != 0:
        missing = _not_implemented(result.output)
        if missing:
            raise ctx.error(f"TVM's ONNX frontend has no converter for: {', '.join(missing)}",
                            log=True, hint="the op coverage table predicted otherwise: add these "
                            "ops to pipeline/coverage.py, or leave the model out of this target")
        raise ctx.error(f"TVM compile failed ({describe_exit(result.returncode)}):\n"
                        f"{tail(result.output)}", log=True,
                        hint="read the log; the target comes from the ABI in the target's YAML")
    summary = json.loads(result.output.strip().splitlines()[-1])
    report = {"compiler": "tvm", "target": ctx.config["target"], "linker": ctx.config["linker"],
              "entry": ctx.config["entry"], "size": so.stat().st_size,
              "tuning": ctx.config["tuning"], "tuned_workloads": summary["tuned_workloads"],
              "tuning_records": summary["tuning_records"]}
    ctx.output("compile.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _not_implemented(output: str) -> list[str]:
    marker = "The following operators are not supported for frontend ONNX: "
    for line in output.splitlines():
        if marker in line:
            return sorted(op.strip() for op in line.split(marker, 1)[1].split(","))
    return []


# ----------------------------------------------------------------------------- the child
def import_onnx(path: Path):
    """The static ONNX model as a Relax module (shapes and dtypes from the model itself)."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx
    return from_onnx(onnx.load(str(path)))


def load_database(folder: Path):
    from tvm.s_tir import meta_schedule as ms
    return ms.database.JSONDatabase(
        path_workload=str(folder / "database_workload.json"),
        path_tuning_record=str(folder / "database_tuning_record.json"), allow_missing=False)


def export(executable, out: Path, linker: str) -> None:
    from tvm.support import cc
    # a fresh cross_compiler per export: it mutates the option list it closes over
    executable.export_library(str(out), fcompile=cc.cross_compiler(linker))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tvm_compile")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", required=True, help="the TVM target as JSON")
    parser.add_argument("--linker", required=True)
    parser.add_argument("--entry", default="main")
    parser.add_argument("--database", help="a folder with a MetaSchedule JSON database to apply")
    args = parser.parse_args(argv)

    import tvm

    mod = import_onnx(Path(args.model))
    if args.entry not in [gv.name_hint for gv in mod.functions]:
        print(f"the Relax module has no function {args.entry!r}", file=sys.stderr)
        return 3
    target = tvm.target.Target(json.loads(args.target))
    records = workloads = 0
    if args.database:
        from tvm.s_tir import meta_schedule as ms
        db = load_database(Path(args.database))
        records = len(db.get_all_tuning_records())
        workloads = len((Path(args.database) / "database_workload.json").read_text().splitlines())
        executable = ms.relax_integration.compile_relax(db, mod, target, params=None)
    else:
        executable = tvm.compile(mod, target=target)
    export(executable, Path(args.out), args.linker)
    print(json.dumps({"tuned_workloads": workloads, "tuning_records": records}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
