"""Stage `tvm_compile`: static ONNX -> TVM Relax -> a shared library (`model.so`) for one TVM ABI.

    ONNX (static, simplified)  --relax.frontend.onnx-->  Relax  --tvm.compile-->  VM executable
      [--MetaSchedule database (tvm_tune), applied by compile_relax-->]
      --export_library(g++ or aarch64-linux-gnu-g++)-->  model.so (weights embedded, entry `main`)

A TVM ABI is declared in the target's YAML next to the IREE ones, with `compiler: tvm`
(pipeline/spec/tvm.py has the keys).

The TVM target is a dict (`target_dict`), never a string (TVM 0.27 rejects "llvm -mcpu=...").
The compile runs in a child process (`python -m pipeline.stages.tvm_compile`): a crash in TVM is an
error of this stage, and TVM's own chatter goes to the step's log. Two compiles of the same
model and target give byte-identical `.so` files (checked by the tests).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..compilers.backend import ENTRY
from ..compilers.builds import built_abis, proxy_abis
from ..compilers.tvm_backend import KIND, TVM
from ..compilers.tvm_relax import Budget, import_onnx
from ..core.layout import static_model
from ..core.steps import StageConfig, Step, abi_step_name, key_value, where
from ..core.store import pretty_json
from ..core.tools import describe_exit, python_module_argv, run_tool, tail
from ..spec.tvm import DATABASE, budget

VERSION = 1
OUTPUTS = (TVM.artifact, "compile.json")
TOOLS = ("apache-tvm", "apache-tvm-ffi", "onnx")


@dataclass(frozen=True)
class Config(StageConfig):
    """A TVM ABI's compile config (spec TvmAbi.compile_config), the entry point, the tuning."""
    compiler: str                   # tvm
    backend: str                    # llvm (TVM's target kind)
    arch: str                       # aarch64 | x86_64
    triple: str
    cpu: str                        # LLVM -mcpu
    cpu_features: tuple[str, ...]   # LLVM -mattr
    num_cores: int                  # MetaSchedule's parallelism hint
    target: dict                    # the TVM target dict made of the above
    linker: str                     # the C++ driver that links model.so
    entry: str                      # the compiled entry point
    tuning: Budget | None           # the budget of the database applied (None: untuned)

    def problems(self):
        if (self.compiler, self.backend) != (TVM.name, KIND):
            yield (f"compiler and backend must be {TVM.name} and {KIND}, got {self.compiler!r}, "
                   f"{self.backend!r}")
        if self.target.get("kind") != "llvm" or self.target.get("mcpu") != self.cpu:
            yield f"target must be the LLVM target dict of cpu {self.cpu!r}, got {self.target!r}"
        if not self.entry:
            yield "entry must name the compiled entry point"

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(**{**key, "tuning": key["tuning"] and Budget.from_key(key["tuning"])})


# ----------------------------------------------------------------------------- the stage
def compile_argv(model: Path, config: dict, out: Path, database: Path | None) -> list[str]:
    """The child command that compiles `model` into `out` for `config` (a Config's key, or any
    dict with its target, linker and entry: bench/compilers.py makes one); pure: no toolchain."""
    argv = python_module_argv("pipeline.stages.tvm_compile", "--model", str(model), "--out", str(out),
                              "--target", json.dumps(config["target"], sort_keys=True),
                              "--linker", config["linker"], "--entry", config["entry"])
    if database is not None:
        argv += ["--database", str(database)]
    return argv


def run(ctx) -> None:

    cfg = ctx.cfg
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    database = None
    if cfg.tuning:
        database = ctx.scratch / "database"  # a private copy: TVM's JSONDatabase opens for append
        database.mkdir()
        for name in ("database_workload.json", "database_tuning_record.json"):
            shutil.copyfile(ctx.input(name), database / name)
    so = ctx.output(TVM.artifact)
    result = run_tool(compile_argv(ctx.input("model"), cfg.as_key(), so, database), log=ctx.log,
                      what="TVM compile", check=False, timeout=3600, **where)
    if database is not None:
        shutil.rmtree(database)
    if result.returncode != 0:
        missing = _not_implemented(result.output)
        if missing:
            raise ctx.error(f"TVM's ONNX frontend has no converter for: {', '.join(missing)}",
                            log=True, hint="the op coverage table predicted otherwise: add these "
                            "ops to pipeline/stages/coverage.py, or leave the model out of this target")
        raise ctx.error(f"TVM compile failed ({describe_exit(result.returncode)}):\n"
                        f"{tail(result.output)}", log=True,
                        hint="read the log; the target comes from the ABI in the target's YAML")
    summary = json.loads(result.output.strip().splitlines()[-1])
    report = {"compiler": TVM.name, "target": cfg.target, "linker": cfg.linker,
              "entry": cfg.entry, "size": so.stat().st_size,
              "tuning": key_value(cfg.tuning), "tuned_workloads": summary["tuned_workloads"],
              "tuning_records": summary["tuning_records"]}
    ctx.output("compile.json").write_text(pretty_json(report))


def _not_implemented(output: str) -> list[str]:
    marker = "The following operators are not supported for frontend ONNX: "
    for line in output.splitlines():
        if marker in line:
            return sorted(op.strip() for op in line.split(marker, 1)[1].split(","))
    return []


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    out = []
    for model in project.models:
        for target in project.targets:
            out += [compile_step(project, model, target, a)
                    for a in built_abis(project, model, target, TVM)]
        out += [compile_step(project, model, target, abi)
                for target, abi in proxy_abis(project, model, TVM)]
    return out


def compile_step(project, model, target, abi) -> Step:
    layout = project.layout
    tuning = budget(model, target)
    inputs = {"model": static_model(layout, model)}
    if tuning:
        tuned = layout.artifact_stage(target.name, model.name, abi.name, TVM.tune_stage)
        for name in DATABASE:
            inputs[name] = tuned / name
    return Step(stage=TVM.compile_stage, name=abi_step_name(model, target, abi), version=VERSION,
                config=Config(**abi.compile_config(), entry=ENTRY,
                              tuning=Budget(tuning["trials"], tuning["per_task"]) if tuning else None),
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, TVM.compile_stage),
                tools=TOOLS + (abi.cross_compiler,), action=run, layout=layout,
                doc=f"TVM Relax for {abi.triple} ({abi.cpu})"
                    + (f", tuned ({tuning['trials']} trials)" if tuning else ", untuned"),
                where=where(model, target, abi), after=(f"coverage:{target.name}/{model.name}",))


# ----------------------------------------------------------------------------- the child
def load_database(folder: Path):
    from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list
    return ms.database.JSONDatabase(
        path_workload=str(folder / "database_workload.json"),
        path_tuning_record=str(folder / "database_tuning_record.json"), allow_missing=False)


def export(executable, out: Path, linker: str) -> None:
    from tvm.support import cc  # tvm: 2.8 s, not needed by doit list
    # a fresh cross_compiler per export: it mutates the option list it closes over
    executable.export_library(str(out), fcompile=cc.cross_compiler(linker))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.tvm_compile")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", required=True, help="the TVM target as JSON")
    parser.add_argument("--linker", required=True)
    parser.add_argument("--entry", default="main")
    parser.add_argument("--database", help="a folder with a MetaSchedule JSON database to apply")
    args = parser.parse_args(argv)

    import tvm  # tvm: 2.8 s, not needed by doit list

    mod = import_onnx(Path(args.model))
    if args.entry not in [gv.name_hint for gv in mod.functions]:
        print(f"the Relax module has no function {args.entry!r}", file=sys.stderr)
        return 3
    target = tvm.target.Target(json.loads(args.target))
    records = workloads = 0
    if args.database:
        from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list
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
