"""Stage `iree_compile`: static ONNX -> MLIR (iree-import-onnx) -> .vmfb for one target ABI.

The command line is a pure function of the ABI's config (`compile_argv`). Reproducibility:
the MLIR is always named model.mlir and source maps and debug symbols are stripped, so the
same model and flags give byte-identical .vmfb files in any folder.
When IREE cannot lower an op, the error lists the ONNX ops it could not legalize.

Fallbacks: an ABI may declare `fallbacks:` (pipeline/targets/*.yaml), flag sets tried in order
when iree-compile fails with its own flags (e.g. without --iree-opt-data-tiling). compile.json
records every attempt (its flags, and the first `error:` line of those that failed) and, when
one was used, the fallback and why. When every attempt fails, the error shows IREE's own
diagnostics (`error:` and `note:` lines, the failing op), not the tail of an IR dump. A
validation twin tries only the flag set that compiled its shipped artifact (it reads that
compile.json): the validation of a twin built otherwise would speak for nothing.

Vulkan builds run iree-compile in two phases, to the executable sources (whose `iree_gpu.target`
records are what the artifact requires of a device: `requires` in compile.json) and from there
to the .vmfb; the bytes are those of a single run (tests/e2e/test_vulkan.py compares them).

Configs: an ABI may declare `configs:`, named flag sets `doit search` tries per model
(pipeline/bench/config_search.py); the one pinned in models/<m>/configs/<target>.yaml is added
to the ABI's flags (`config`: its name, flags, and the target whose search chose it), recorded in
compile.json and the manifest. No pin: the build's own search ranks them (stage search_configs,
compilers/config_choice.py; the step reads its ranking.json as an input and adds the winner's
flags and rewrites), or with `search=0` the ABI's base flags. compile.json's `config.from` says
which: `pin`, `search` or `base` (with `why`), or `default`: no search ranked a config and the
config a model without a pin gets (config_choice.UNPINNED, when set) rewrote something. An ABI
without configs: no config (the key is what it was without configs).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..compilers.iree_compiler import (attempts, compile_argv, compile_flags, diagnostics,
                                       find_compiler, first_error, import_argv, unsupported_ops)
from ..compilers.backend import ENTRY
from ..compilers.builds import built_abis, proxy_abis, variant_abis, variant_skip_reason
from ..compilers.config_choice import CAP_VARIABLE, decide, default_cap_s, ranking_file
from ..compilers.iree_backend import IREE
from ..compilers.iree_targets import requirements
from ..core.layout import golden_files, read_golden, static_model
from ..core.numerics import compare, describe_failures, summary
from ..core.errors import PipelineError
from ..core.steps import StageConfig, Step, abi_step_name, key_value, where
from ..core.store import pretty_json
from ..core.tools import describe_exit, run_tool, tail
from ..rewrite.abi_rewrites import REWRITES
from ..rewrite.abi_rewrites import apply as apply_rewrites
from ..rewrite.abi_rewrites import rewritten
from ..spec.target import DEFAULT_CONFIG, IREE_BACKENDS
from ..spec.variants import FP16_FEATURES, PRECISIONS, variant_model

VERSION = 3
OUTPUTS = (IREE.artifact, "compile.json")
_CPU_FIELDS = ("arch", "triple", "cpu", "cpu_features")
_VULKAN_FIELDS = ("vulkan_target", "vulkan_features")


@dataclass(frozen=True)
class Config(StageConfig):
    """An ABI's compile config (spec AbiSpec.compile_config, or twin_config) and the entry point."""
    compiler: str                        # iree
    backend: str                         # llvm-cpu | vulkan-spirv
    flags: tuple[str, ...]               # the ABI's own extra flags
    entry: str                           # the compiled entry point
    arch: str | None = None              # llvm-cpu: aarch64 | x86_64
    triple: str | None = None            # llvm-cpu: the LLVM target triple
    cpu: str | None = None               # llvm-cpu: the LLVM CPU
    cpu_features: tuple[str, ...] | None = None  # llvm-cpu: LLVM attributes (+neon, ...)
    vulkan_target: str | None = None     # vulkan-spirv: IREE's Vulkan target name
    vulkan_features: str | None = None   # vulkan-spirv: replaces the target's SPIR-V features
    precision: str | None = None         # a precision variant's: int8 | fp16
    fallbacks: tuple[dict, ...] = ()     # the ABI's declared fallbacks: {drop, add, why}, in order
    workarounds: tuple[dict, ...] = ()   # the ABI's compiler-bug workarounds: {name, flags, rewrites, why}
    config: dict | None = None           # the pinned config (docs/configs.md): {name, flags, rewrites, pin}
    search: dict | None = None           # no pin: {from: search, source: TARGET/ABI, configs: [...]}
                                         # (this build's ranking, input `search`) or {from: base, why}
    check: dict | None = None            # with search's `default`: what the validate step holds
                                         # the artifact to ({run, entry, tolerance, arithmetic}),
                                         # checked here before the default config's artifact is
                                         # kept (else the base flags)

    def problems(self):
        if self.compiler != IREE.name:
            yield f"compiler must be {IREE.name}, got {self.compiler!r}"
        if self.backend not in IREE_BACKENDS:
            yield f"backend must be one of {', '.join(IREE_BACKENDS)}, got {self.backend!r}"
        elif self.backend == "llvm-cpu" and (None in (self.arch, self.triple, self.cpu, self.cpu_features)
                                              or self.vulkan_target or self.vulkan_features):
            yield "an llvm-cpu ABI gives arch, triple, cpu and cpu_features, and no vulkan_target or vulkan_features"
        elif self.backend == "vulkan-spirv" and (not self.vulkan_target or any(
                getattr(self, f) is not None for f in _CPU_FIELDS)):
            yield "a vulkan-spirv ABI gives vulkan_target (and maybe vulkan_features), and no CPU fields"
        if not self.entry:
            yield "entry must name the compiled entry point"
        if self.precision is not None and self.precision not in PRECISIONS:
            yield f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
        for f in self.fallbacks:
            if not isinstance(f, dict) or set(f) != {"drop", "add", "why"}:
                yield f"a fallback is {{drop, add, why}}, got {f!r}"
        for w in self.workarounds:
            if not isinstance(w, dict) or set(w) != {"name", "flags", "rewrites", "why"}:
                yield f"a workaround is {{name, flags, rewrites, why}}, got {w!r}"
            elif unknown := [r for r in w["rewrites"] if r not in REWRITES]:
                yield f"workaround {w['name']!r}: unknown rewrite(s) {', '.join(unknown)}"
        if self.config is not None and (not isinstance(self.config, dict)
                                        or set(self.config) != {"name", "flags", "rewrites", "pin"}
                                        or not all(isinstance(f, str) for f in self.config["flags"])):
            yield (f"a config is {{name, flags, rewrites, pin}} with flags a list of strings, "
                   f"got {self.config!r}")
        elif self.config is not None and (unknown := [r for r in self.config["rewrites"]
                                                      if r not in REWRITES]):
            yield f"config {self.config['name']!r}: unknown rewrite(s) {', '.join(unknown)}"
        if self.search is not None and (self.config is not None or not isinstance(self.search, dict)
                                        or (self.search.get("from"),
                                            sorted(set(self.search) - {"default"})) not in (
                                            ("search", ["configs", "from", "source"]),
                                            ("base", ["from", "why"]))):
            yield (f"search is {{from: search, source, configs}} or {{from: base, why}} (and "
                   f"maybe default), and only without a pinned config, got {self.search!r}")

    def as_key(self) -> dict:
        """The ABI's compile config as the spec gives it, plus entry (and a variant's precision)."""
        own = _CPU_FIELDS if self.backend == "llvm-cpu" else _VULKAN_FIELDS
        key = {"compiler": self.compiler, "backend": self.backend,
               **{f: key_value(getattr(self, f)) for f in own}, "flags": list(self.flags),
               "entry": self.entry}
        if self.precision is not None:
            key["precision"] = self.precision
        if self.fallbacks:
            key["fallbacks"] = key_value(self.fallbacks)
        if self.workarounds:
            key["workarounds"] = key_value(self.workarounds)
        if self.config is not None:
            key["config"] = key_value(self.config)
        if self.search is not None:
            key["search"] = key_value(self.search)
        if self.check is not None:
            key["check"] = key_value(self.check)
        return key


def run(ctx) -> None:
    cfg, origin = _chosen(ctx, ctx.cfg)
    if origin is not None and origin.get("from") == "default":
        tried = _try_default(ctx, cfg, origin)
        if tried is None:
            return
        cfg = dataclasses.replace(cfg, config=None)
        origin = {**origin, "from": "base",
                  "why": f"{origin['why'].split(': ' + tried['name'] + ', the config')[0]}; "
                         f"{tried['name']}, the config of a model without a pin, was tried first: "
                         f"{tried['why']}; the base flags instead", "default_tried": tried}
        note = (f"modelyard: [model={ctx.step.where.get('model')} target={ctx.step.where.get('target')} "
                f"stage={ctx.step.stage}] {tried['name']} (the config of a model without a pin) "
                f"{tried['why']}: built with the ABI's base flags instead (compile.json "
                f"config.default_tried)")
        with open(ctx.log, "a") as log:
            log.write(note + "\n")
        print(note, file=sys.stderr, flush=True)
    _build(ctx, cfg, origin)


class _OverCap(Exception):
    """iree-compile ran past the cap of the config of a model without a pin."""


def _try_default(ctx, cfg: Config, origin: dict) -> dict | None:
    """Build with the config of a model without a pin (config_choice.UNPINNED) with iree-compile
    capped (config_choice.default_cap_s) and the artifact checked against golden here, as the
    validate step will (cfg.check): None when it was built and passed (the outputs are written);
    else what was tried and why it is not kept ({name, flags, rewrites, status, why, seconds,
    cap_s}), the outputs removed, for the base flags."""
    cap = default_cap_s()
    tried = {"name": cfg.config["name"], "flags": list(cfg.config["flags"]),
             "rewrites": list(cfg.config["rewrites"]), "cap_s": cap}
    began = time.monotonic()
    try:
        _build(ctx, cfg, origin, timeout=cap)
        if cfg.check is not None:
            _check(ctx, cfg.check, ctx.output(IREE.artifact))
        return None
    except _OverCap:
        tried.update(status="over-cap", why=f"iree-compile ran past its cap of {cap:g} s "
                                            f"({CAP_VARIABLE} sets it) and was stopped")
    except PipelineError as err:
        stage = "validation" if ctx.output(IREE.artifact).is_file() else "compile"
        lines = [l.strip() for l in err.what.strip().splitlines()]
        first = " ".join([lines[0]] + [l for l in lines[1:] if "error:" in l][:1])[:300]
        tried.update(status=f"failed-{stage}",
                     why=f"its {stage} failed: {first}".replace(f"{ctx.scratch}/", ""))
    tried["seconds"] = round(time.monotonic() - began, 1)
    for name in OUTPUTS:
        ctx.output(name).unlink(missing_ok=True)
    return tried


def check_of(model, abi) -> dict:
    """What the validate step holds the ABI's artifact to (stages/validate.py validate_step): how
    it runs here, its tolerance against golden and the arithmetic the bounds follow."""
    tolerance, _ = IREE.validation_tolerance(abi, None) or (model.tolerance.as_dict(), None)
    arithmetic = getattr(abi, "precision", None)
    return {"run": dict(abi.run), "entry": ENTRY, "tolerance": tolerance,
            "arithmetic": None if arithmetic in (None, "fp32") else arithmetic}


def _check(ctx, check: dict, vmfb: Path) -> None:
    """Run the artifact on the golden inputs as the validate step will and compare; a failed run
    or outputs beyond the tolerance raise PipelineError."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    doc, _, expected = read_golden(ctx)
    inputs = [ctx.input(f"golden:{e['file']}") for e in doc["inputs"]]
    outputs = [ctx.scratch / f"check_{k}.npy" for k in range(len(doc["outputs"]))]
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    argv, executed, env = IREE.runner(check["run"], check["entry"], vmfb, inputs, outputs, where)
    run_tool(argv, log=ctx.log, what=f"running the artifact on golden's inputs ({executed['where']})",
             env=env, timeout=3600, hint=IREE.run_hint, **where)
    actual = []
    for path, want in zip(outputs, expected):
        got = np.load(path, allow_pickle=False)
        if got.dtype != want.dtype and got.dtype.kind in "iu" and want.dtype.kind in "iu" \
                and got.dtype.itemsize == want.dtype.itemsize:  # IREE's signless integers
            got = got.view(want.dtype)
        actual.append(got)
        path.unlink()
    result = compare(actual, expected, [o["name"] for o in doc["outputs"]], check["tolerance"],
                     check["arithmetic"])
    if not result["passed"]:
        raise ctx.error(f"outputs differ from golden: {describe_failures(result)} ({summary(result)})",
                        hint=IREE.wrong_hint)


def _build(ctx, cfg: Config, origin: dict | None, timeout: float | None = None) -> None:
    """Import, rewrite and compile with `cfg`'s flags (its attempts), writing the artifact and
    compile.json. `timeout`: iree-compile's cap in seconds (_OverCap past it)."""
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    mlir = ctx.scratch / "model.mlir"
    source, applied = ctx.input("model"), []
    pinned = list((cfg.config or {}).get("rewrites") or ())
    rewrites = [r for w in cfg.workarounds for r in w["rewrites"]] + pinned
    if rewrites:  # the ABI's graph workarounds, then its pinned config's, on a copy of the model
        source = ctx.scratch / "model.onnx"
        applied = apply_rewrites(ctx.input("model"), rewrites, source)
    run_tool(import_argv(source, mlir), log=ctx.log, what="iree-import-onnx", **where)
    if applied:
        source.unlink()
    vmfb = ctx.output(IREE.artifact)
    # Run in the scratch folder on a relative "model.mlir": some SPIR-V targets (llvmpipe) keep
    # the source file name in the artifact, which must not depend on where the build happens.
    tried, used, requires = [], None, None
    for attempt in _attempts(ctx, cfg):
        config = _attempt_config(cfg, attempt)
        result, requires = _compile(ctx, cfg, config, mlir, vmfb, timeout)
        if result.timed_out:
            vmfb.unlink(missing_ok=True)
            mlir.unlink(missing_ok=True)
            raise _OverCap()
        if result.returncode == 0:
            used = attempt
            tried.append({"flags": attempt["flags"], "status": "ok"})
            break
        tried.append({"flags": attempt["flags"], "status": "failed",
                      "error": first_error(result.output.replace(f"{ctx.scratch}/", ""))})
        vmfb.unlink(missing_ok=True)
        if "Unknown Vulkan target" in result.output:
            mlir.unlink(missing_ok=True)
            raise ctx.error(f"IREE does not know the Vulkan target {cfg.vulkan_target!r}",
                            log=True, hint="fix vulkan_target in the target's YAML")
    if used is None:
        mlir.unlink(missing_ok=True)
        raise _failed(ctx, cfg, result, tried)
    report = {"compiler": IREE.name, "flags": compile_flags(config), "entry": cfg.entry,
              "size": vmfb.stat().st_size}
    if cfg.config is not None:  # the pinned config (its flags are in `flags`, after the ABI's own)
        report["config"] = {**cfg.config, "flags_used": all(f in used["flags"]
                                                            for f in cfg.config["flags"]),
                            "rewritten": applied[len(rewrites) - len(pinned):] if pinned else [],
                            **(origin or {})}
    elif origin is not None:  # the base flags: searched and found fastest, or not searched
        report["config"] = {"name": DEFAULT_CONFIG, "flags": [], "rewrites": [], **origin}
    if cfg.workarounds:  # what each did: its flags are in `flags`, its rewrites touched these nodes
        report["workarounds"] = [{"name": w["name"], "why": w["why"], "flags": list(w["flags"]),
                                  "flags_used": all(f in used["flags"] for f in w["flags"]),
                                  "rewrites": [a for a in applied if a["rewrite"] in w["rewrites"]]}
                                 for w in cfg.workarounds]
    if "shipped" in ctx.step.inputs:  # a twin: the flag set that compiled the shipped artifact
        report["flags_from"] = "the shipped artifact's compile.json (the attempt that compiled it)"
    if len(tried) > 1 or cfg.fallbacks:
        report["attempts"] = tried
        after = ("the shipped artifact's failed attempt(s), in its compile.json"
                 if "shipped" in ctx.step.inputs else
                 f"{len(tried) - 1} failed attempt(s); the first: {tried[0].get('error')}")
        report["fallback"] = None if used["fallback"] is None else {**used["fallback"], "after": after}
    if requires is not None:
        report["requires"] = {"vulkan": requires}
        if cfg.precision == "fp16":  # never ship fp16 kernels to a device without fp16
            missing = [f for f in FP16_FEATURES
                       if f not in report["requires"]["vulkan"]["device_features"]]
            if missing:
                raise ctx.error(f"fp16 model compiled for {cfg.vulkan_target}, which "
                                f"declares no {' / '.join(missing)}: its kernels would return "
                                f"wrong numbers without an error", hint="build fp16 variants for "
                                "Vulkan targets with 16-bit storage only (valhall*, llvmpipe, ...)")
    mlir.unlink(missing_ok=True)
    ctx.output("compile.json").write_text(pretty_json(report))


def _chosen(ctx, cfg: Config) -> tuple[Config, dict | None]:
    """The config this build applies, and where it came from (compile.json's `config.from`): the
    pin; this build's search (its ranking, the winner's flags and rewrites as this ABI declares
    them); or the base flags and why (search=0, the budget used before any other candidate was
    tried, nothing validated)."""
    if cfg.search is None:
        return cfg, ({"from": "pin"} if cfg.config is not None else None)
    if cfg.search["from"] == "base":
        return _unpinned(ctx, cfg, {"from": "base", "why": cfg.search["why"]})
    ranking = json.loads(ctx.input("search").read_text())
    name, source = ranking["config"], cfg.search["source"]
    facts = {"searched": source, "ranking": ranking["ranking"], "not_tried": ranking["not_tried"],
             "budget_s": ranking["budget_s"], "spent_s": ranking["spent_s"]}
    if name is not None:
        facts["ratio_to_onnxruntime"] = ranking["candidates"][name].get("ratio_to_onnxruntime")
    base = lambda why: (dataclasses.replace(cfg, search=None), {"from": "base", "why": why, **facts})
    unpinned = lambda why: _unpinned(ctx, cfg, {"from": "base", "why": why, **facts})
    others = [n for n in ranking["order"] if n != DEFAULT_CONFIG]
    if name is None and DEFAULT_CONFIG in ranking["not_tried"]:
        return unpinned(f"the search of {source} used its budget of {ranking['budget_s']:g} s "
                        f"before a candidate was built and validated (search=SECONDS gives more)")
    if name is None:
        return base(f"the search of {source} in this build validated no candidate")
    if name == DEFAULT_CONFIG and others and all(n in ranking["not_tried"] for n in others):
        return unpinned(f"the search of {source} used its budget of {ranking['budget_s']:g} s "
                        f"before any config besides {DEFAULT_CONFIG} was built and validated "
                        f"(search=SECONDS gives more)")
    if name == DEFAULT_CONFIG:
        return dataclasses.replace(cfg, search=None), {"from": "search", **facts}
    declared = next((c for c in cfg.search["configs"] if c["name"] == name), None)
    if declared is None:
        return base(f"the search of {source} ranked {name} first, which this ABI does not declare")
    config = {"name": name, "flags": list(declared["flags"]), "rewrites": list(declared["rewrites"]),
              "pin": source.split("/")[0]}
    return dataclasses.replace(cfg, config=config, search=None), {"from": "search", **facts}


def _unpinned(ctx, cfg: Config, base: dict) -> tuple[Config, dict]:
    """No config ranked: the config a model without a pin gets (`default` of the search dict,
    compilers/config_choice.py UNPINNED), or the base flags when there is none or it has no flag
    and its rewrites find nothing to rewrite in this model (the bytes of the base)."""
    default = cfg.search.get("default")
    plain = dataclasses.replace(cfg, search=None)
    if not default:
        return plain, base
    if not default["flags"]:
        import onnx  # onnx: 1.5 s, not needed by doit list
        _, done = rewritten(onnx.load(str(ctx.input("model"))), default["rewrites"])
        if not any(d["nodes"] for d in done):
            return plain, base
    return (dataclasses.replace(plain, config={**default, "pin": None}),
            {**base, "from": "default",
             "why": f"{base['why']}: {default['name']}, the config of a model without a pin "
                    f"(docs/configs.md)"})


def _compile(ctx, cfg: Config, config: dict, mlir: Path, vmfb: Path, timeout: float | None = None):
    """One iree-compile attempt; returns (its ToolRun, the Vulkan requirements or None).

    A Vulkan build runs in two phases: up to the executable sources (printed with their source
    locations), whose `iree_gpu.target` records are what the artifact requires of a device, then
    from there to the .vmfb. The bytes are those of one run (the locations in the artifact are the
    original model.mlir's); the requirements come from the compiler itself at no extra compile."""
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    argv = compile_argv(find_compiler(), config, Path(mlir.name), vmfb)
    if cfg.backend != "vulkan-spirv":
        return run_tool(argv, log=ctx.log, what="iree-compile", check=False, cwd=ctx.scratch,
                        timeout=timeout, **where), None
    staged = ctx.scratch / "executable-sources"
    staged.mkdir(exist_ok=True)
    sources = staged / mlir.name  # the same name: an op without a location gets this file's
    first = compile_argv(find_compiler(), config, Path(mlir.name), sources)
    result = run_tool(first + ["--compile-to=executable-sources", "--mlir-print-debuginfo"],
                      log=ctx.log, what="iree-compile --compile-to=executable-sources", check=False,
                      cwd=ctx.scratch, **where)
    if result.returncode != 0:
        return result, None
    requires = requirements(sources.read_text())
    result = run_tool(argv + ["--compile-from=executable-sources"], log=ctx.log,
                      what="iree-compile --compile-from=executable-sources", check=False,
                      cwd=staged, **where)
    sources.unlink()
    return result, requires


def _attempt_config(cfg: Config, attempt: dict) -> dict:
    """The compile config of one attempt: its flags already hold the pinned config's and the
    workarounds' (attempts()), so those are not added again."""
    config = {**cfg.as_key(), "flags": attempt["flags"]}
    config.pop("workarounds", None)
    config.pop("config", None)
    config.pop("search", None)
    return config


def _attempts(ctx, cfg: Config) -> list[dict]:
    """The flag sets to try: the ABI's (attempts()); a twin tries only the one that compiled the
    shipped artifact, which validation requires anyway (a twin with other flags speaks for
    nothing), instead of failing again through the attempts the shipped build already failed."""
    every = attempts(cfg.as_key())
    if "shipped" not in ctx.step.inputs:
        return every
    own = lambda flags: [f for f in flags if not f.startswith(("--iree-vulkan-target=",
                                                               "--iree-vulkan-target-features="))]
    shipped = own(json.loads(ctx.input("shipped").read_text())["flags"])
    for attempt in every:
        if own(compile_flags(_attempt_config(cfg, attempt))) == shipped:
            return [attempt]
    raise ctx.error(f"the shipped artifact was compiled with flags none of this twin's attempts "
                    f"gives ({' '.join(shipped)})", hint="the twin's config must be the shipped "
                    "ABI's with another Vulkan target: check the ABI's run.twin in the target YAML")


def graph_rewrites(report: dict) -> list[str]:
    """The graph rewrites a compile report (compile.json) says its model went through, in the
    order they ran: the ABI's workarounds', then its pinned config's (see `run`)."""
    return ([r["rewrite"] for w in report.get("workarounds", []) for r in w.get("rewrites", [])]
            + list((report.get("config") or {}).get("rewrites") or ()))


def _failed(ctx, cfg: Config, result, tried: list):
    """Every attempt failed: the ops IREE could not lower, or its own diagnostics of the last
    attempt (error/note lines and the failing op), never the tail of an IR dump."""
    ops = unsupported_ops(result.output)
    if ops:
        return ctx.error(f"IREE ({cfg.backend}) cannot compile these ONNX ops: "
                         f"{', '.join(ops)}", log=True,
                         hint="replace those ops in the model (or export it differently), or "
                              "leave the model out of this target")
    found = diagnostics(result.output.replace(f"{ctx.scratch}/", ""))
    shown = "\n".join("    " + l for l in found) if found else tail(result.output)
    tries = ""
    if len(tried) > 1:
        tries = "".join(f"\n  attempt {k + 1} ({' '.join(t['flags']) or 'no extra flags'}): "
                        f"{t['error']}" for k, t in enumerate(tried))
    return ctx.error(f"iree-compile failed ({describe_exit(result.returncode)}"
                     f"{f', all {len(tried)} attempts' if len(tried) > 1 else ''}):\n{shown}{tries}",
                     log=True, hint="read the log; the flags (and fallbacks) come from the "
                                    "target's ABI definition")


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """Per model, target and ABI the model is built for: the artifact (and a Vulkan twin when
    the artifact cannot run here); precision variants' artifacts; the host proxies' artifacts."""
    layout, out = project.layout, []
    for model in project.models:
        for target in project.targets:
            for abi in built_abis(project, model, target, IREE):
                pinned = project.configs.get((target.name, model.name, abi.name))
                out.append(compile_step(layout, model, target, abi, config=pinned,
                                        search=_search(project, model, target, abi)))
                if abi.run["via"] == "twin":
                    out.append(compile_step(layout, model, target, abi, twin=True, config=pinned))
        for v in model.variants:
            out += variant_steps(layout, model, v, project.targets)
    for model in project.models:
        for target, abi in proxy_abis(project, model, IREE):
            out.append(compile_step(layout, model, target, abi,
                                    config=project.configs.get((target.name, model.name, abi.name)),
                                    search=_search(project, model, target, abi)))
    return out


def _search(project, model, target, abi) -> dict | None:
    """compile_step's `search` for an ABI with configs and no pin (compilers/config_choice.py):
    this build's ranking (its file, through the step's inputs) or the base flags and why."""
    choice = decide(project, model, target, abi)
    if choice is None or choice["from"] == "pin":
        return None
    default = {"default": choice["default"]} if choice.get("default") else {}
    if choice["from"] == "base":
        return {"from": "base", "why": choice["why"], **default}
    source, source_abi = choice["source"]
    return {"from": "search", "source": f"{source.name}/{source_abi.name}",
            "configs": choice["configs"], **default,
            "ranking": ranking_file(project.layout, source.name, model.name, source_abi.name)}


def compile_step(layout, model, target, abi, twin: bool = False, config: dict | None = None,
                 search: dict | None = None) -> Step:
    """The shipped artifact; or (twin=True) its runnable twin: same model and flags, another
    device. `config`: the pinned config ({name, flags, rewrites, pin}) added to the ABI's.
    `search` (no pin): {from: search, source, configs, ranking: the file} or {from: base, why}."""
    search = dict(search) if search else None
    ranking = search.pop("ranking", None) if search else None
    abi_config = abi.twin_config() if twin else abi.compile_config()
    if abi.backend == "vulkan-spirv":
        doc = f"IREE Vulkan SPIR-V for {abi_config['vulkan_target']}" + (" (validation twin)" if twin else "")
    else:
        doc = f"IREE {abi.backend} for {abi.triple} ({abi.cpu})"
    if config is not None:
        doc += f", config {config['name']} (pinned by doit search target={config['pin']})"
    inputs = {"model": static_model(layout, model)}
    if ranking is not None:
        inputs["search"] = ranking
        doc += f", the config this build's search of {search['source']} ranks first"
    check = None
    if search and search.get("default") and not twin:  # checked here before it is kept
        inputs.update(golden_files(layout, model))
        check = check_of(model, abi)
    if twin:  # built with the flags that compiled the shipped artifact
        inputs["shipped"] = layout.artifact_stage(target.name, model.name, abi.name,
                                                  IREE.compile_stage) / "compile.json"
    return Step(stage=IREE.compile_stage, name=abi_step_name(model, target, abi) + ("/twin" if twin else ""),
                version=VERSION, config=Config(**abi_config, entry=ENTRY, config=config, search=search,
                                               check=check),
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name,
                                              "twin_compile" if twin else IREE.compile_stage),
                tools=("iree-base-compiler", "onnx"), action=run, layout=layout,
                doc=doc, where=where(model, target, abi),
                after=(f"coverage:{target.name}/{model.name}",))


def variant_steps(layout, model, v, targets) -> list:
    """A precision variant's artifacts: its quantized model, the ABI's flags; after its gate."""
    out = []
    vm = variant_model(model, v)
    for target in targets:
        for abi in [a for a in variant_abis(target) if IREE.builds(a)]:  # RKNN builds its own
            if variant_skip_reason(model, v, abi, layout.cache):
                continue
            for twin in ((False, True) if abi.run["via"] == "twin" else (False,)):
                s = compile_step(layout, vm, target, abi, twin=twin)
                out.append(dataclasses.replace(
                    s, inputs={**s.inputs, "model": layout.model_stage(vm.name, "quantize") / "model.onnx"},
                    after=(f"accuracy:{vm.name}",), config=dataclasses.replace(s.cfg, precision=v.precision),
                    doc=f"{s.doc}, {v.precision}"))
    return out
