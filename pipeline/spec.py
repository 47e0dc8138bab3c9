"""models/*/model.yaml and the target registry -> frozen, validated specs.

Every problem found is collected and reported at once, naming the file and the key, before
anything is built. Reading a model's input signature needs onnx (slow to import), so it is
memoised by the source file's sha256.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import shapes, sources
from .errors import PipelineError, SpecError, unknown_keys
from .store import atomic_write_text, canonical_json, sha256_file, sha256_text

TARGETS_DIR = Path(__file__).resolve().parent / "targets"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64"}
DEFAULT_OPSET = 17
SIGNATURE_VERSION = 1

try:
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _Loader = yaml.SafeLoader


def display(path: Path) -> str:
    """A path as shown in messages: relative to the working folder when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------- model specs
@dataclass(frozen=True)
class Tolerance:
    max_abs: float
    mean_abs: float
    cosine: float  # minimum cosine similarity

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "cosine": self.cosine}


@dataclass(frozen=True)
class TestData:
    kind: str                 # "random" or "file"
    seed: int = 0
    low: float = 0.0
    high: float = 1.0
    file: Path | None = None  # .npy, for kind == "file"

    def as_dict(self) -> dict:
        if self.kind == "file":
            return {"file": self.file.name, "sha256": sha256_file(self.file)}
        return {"random": {"seed": self.seed, "low": self.low, "high": self.high}}


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    test_data: TestData

    def as_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "test_data": self.test_data.as_dict()}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    spec_path: Path
    source: Path
    source_sha256: str
    inputs: tuple[InputSpec, ...]
    tolerance: Tolerance
    opset: int
    description: str = ""
    licenses: tuple[Path, ...] = ()
    signature: dict = field(default_factory=dict, compare=False, hash=False)
    release: dict = field(default_factory=dict, compare=False, hash=False)  # see _release()
    skip: tuple = ()  # ((ABI name pattern, reason), ...): ABIs this model is not built for
    variants: tuple = ()  # precision variants (variants.VariantSpec), see pipeline/variants.py
    preprocessing: dict = field(default_factory=dict, compare=False, hash=False)  # input -> calibration.Preprocessing
    source_format: str = "onnx"   # onnx | tflite | nnef (see sources.py)
    shape_of: str | None = None   # a shape variant `base.shape` of model `base` (see shapes.py)
    shape: str | None = None
    shapes: tuple = ()            # on the base model: the names of its shape variants' specs
    tvm: dict = field(default_factory=dict, compare=False, hash=False)  # tvm_tune.parse_model()
    ship: dict = field(default_factory=dict, compare=False, hash=False)  # choice.parse_model()

    @property
    def base(self) -> str:
        """The model whose source (and import step) this spec shares."""
        return self.shape_of or self.name

    def skip_reason(self, abi: str) -> str | None:
        """Why this model is not built for `abi` (a declared, recorded decision), or None."""
        import fnmatch
        for pattern, reason in self.skip:
            if fnmatch.fnmatchcase(abi, pattern):
                return reason
        return None

    @property
    def dir(self) -> Path:
        return self.spec_path.parent

    def input_files(self) -> list[Path]:
        return ([i.test_data.file for i in self.inputs if i.test_data.kind == "file"]
                + [p for v in self.variants for p in v.data_files()])


_MODEL_KEYS = {"description", "source", "license", "inputs", "tolerance", "opset", "release", "skip",
               "variants", "preprocessing", "shapes", "tvm", "ship"}
_SOURCE_KEYS = {"path", "sha256"}
_INPUT_KEYS = {"shape", "dtype", "test_data"}
_TOLERANCE_KEYS = {"max_abs", "mean_abs", "cosine"}
_RANDOM_KEYS = {"seed", "low", "high"}
_RELEASE_KEYS = {"waivers", "io"}
_WAIVER_KEYS = {"abi", "reason", "target", "status"}
_IO_KEYS = {"inputs": {"layout", "preprocessing"}, "outputs": {"layout", "postprocessing"}}


class _Problems(list):
    def unknown(self, where: str, got: dict, allowed: set) -> None:
        unknown_keys(self, where, got, allowed)


def _read_yaml(path: Path, problems: _Problems) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError) as exc:
        problems.append(f"{path}: cannot read YAML: {str(exc).splitlines()[0]}")
        return None


def _number(value, where: str, problems: _Problems, kind=float, minimum=None):
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        problems.append(f"{where}: expected a {'number' if kind is float else 'integer'}, got {value!r}")
        return None
    if minimum is not None and value < minimum:
        problems.append(f"{where}: must be >= {minimum}, got {value!r}")
        return None
    return kind(value)


def load_model(spec_path: Path, memo_dir: Path | None = None) -> tuple[list[ModelSpec] | None, list[str]]:
    """Parse and check one model spec; returns ([spec, its shape variants...] or None, problems)."""
    problems = _Problems()
    name = spec_path.parent.name
    where = display(spec_path)
    if not NAME_RE.match(name):
        problems.append(f"{spec_path.parent}: model folder name must match {NAME_RE.pattern}")
    raw = _read_yaml(spec_path, problems)
    if raw is None:
        return None, problems or [f"{where}: empty file"]
    if not isinstance(raw, dict):
        return None, [f"{where}: expected a mapping at the top level"]
    problems.unknown(where, raw, _MODEL_KEYS)
    for key in ("source", "inputs", "tolerance"):
        if key not in raw:
            problems.append(f"{where}: missing required key {key!r}")

    # source
    source, source_sha = None, None
    src = raw.get("source")
    if src is not None:
        if not isinstance(src, dict):
            problems.append(f"{where}: source: expected a mapping with path and sha256")
        else:
            problems.unknown(f"{where}: source", src, _SOURCE_KEYS)
            for key in sorted(_SOURCE_KEYS - set(src)):
                problems.append(f"{where}: source: missing required key {key!r}")
            if "path" in src:
                source = (spec_path.parent / str(src["path"])).resolve()
                if not source.exists():
                    problems.append(f"{where}: source.path: file not found: {source}")
                    source = None
                elif sources.source_format(source) is None:
                    problems.append(f"{where}: source.path: a source is an .onnx or .tflite file or "
                                    f"an NNEF graph folder (got {source.suffix or 'no extension'})")
                    source = None
            if source is not None and "sha256" in src:
                actual = sources.source_sha256(source)
                if str(src["sha256"]).lower() != actual:
                    problems.append(f"{where}: source.sha256: mismatch for {source.name}: spec says "
                                    f"{src['sha256']}, file is {actual}")
                    source = None
                else:
                    source_sha = actual

    # licenses
    licenses = []
    lic = raw.get("license", [])
    for item in ([lic] if isinstance(lic, str) else lic or []):
        path = spec_path.parent / str(item)
        if not path.is_file():
            problems.append(f"{where}: license: file not found: {path}")
        licenses.append(path)

    # tolerance
    tolerance = None
    tol = raw.get("tolerance")
    if tol is not None:
        if not isinstance(tol, dict):
            problems.append(f"{where}: tolerance: expected a mapping")
        else:
            problems.unknown(f"{where}: tolerance", tol, _TOLERANCE_KEYS)
            vals = {}
            for key in sorted(_TOLERANCE_KEYS):
                if key not in tol:
                    problems.append(f"{where}: tolerance: missing required key {key!r}")
                else:
                    vals[key] = _number(tol[key], f"{where}: tolerance.{key}", problems, minimum=0)
            if "cosine" in vals and vals["cosine"] is not None and vals["cosine"] > 1:
                problems.append(f"{where}: tolerance.cosine: a cosine similarity is at most 1")
            if len(vals) == 3 and None not in vals.values():
                tolerance = Tolerance(**vals)

    opset = raw.get("opset", DEFAULT_OPSET)
    opset = _number(opset, f"{where}: opset", problems, kind=int, minimum=11)

    # inputs
    inputs = []
    ins = raw.get("inputs")
    if ins is not None and not isinstance(ins, dict):
        problems.append(f"{where}: inputs: expected a mapping of input name -> shape, dtype")
        ins = None
    for in_name, body in (ins or {}).items():
        iw = f"{where}: inputs.{in_name}"
        if not isinstance(body, dict):
            problems.append(f"{iw}: expected a mapping with shape and dtype")
            continue
        problems.unknown(iw, body, _INPUT_KEYS)
        shape = body.get("shape")
        if not isinstance(shape, list) or not shape and shape != []:
            problems.append(f"{iw}.shape: expected a list of positive integers, got {shape!r}")
            shape = None
        else:
            for k, dim in enumerate(shape):
                if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
                    problems.append(f"{iw}.shape[{k}]: unbound dynamic dim {dim!r}: every dim "
                                    f"must be a positive integer")
                    shape = None
                    break
        dtype = body.get("dtype", "float32")
        if dtype not in DTYPES:
            problems.append(f"{iw}.dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
        test_data = _test_data(body.get("test_data"), spec_path, iw, problems)
        if shape is not None and dtype in DTYPES and test_data is not None:
            inputs.append(InputSpec(str(in_name), tuple(shape), dtype, test_data))

    # against the model itself
    signature = {}
    if source is not None and source_sha is not None:
        signature = model_signature(source, source_sha, memo_dir)
        fmt = sources.source_format(source)
        if "error" in signature:
            problems.append(f"{where}: source.path: {source.name} is not a readable "
                            f"{ {'onnx': 'ONNX model', 'tflite': 'TFLite model', 'nnef': 'NNEF graph'}[fmt]}: "
                            f"{signature['error']}")
        elif ins is not None:
            _check_against_model(signature, raw.get("inputs") or {}, inputs, where, problems)
    release = _release(raw.get("release"), signature, where, problems)
    skip = raw.get("skip") or {}
    if not isinstance(skip, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                             for k, v in skip.items()):
        problems.append(f"{where}: skip: expected a mapping of ABI name pattern -> the reason "
                        f"(e.g. 'vulkan-*': 'IREE miscompiles ...'); a skip without a reason is "
                        f"not allowed")
        skip = {}
    from .variants import parse as parse_variants
    preprocessing, variants = parse_variants(raw, spec_path.parent, inputs, tolerance, where, problems)
    from . import choice, tvm_tune
    tvm = tvm_tune.parse_model(raw.get("tvm"), spec_path.parent, where, problems)
    ship = choice.parse_model(raw.get("ship"), where, problems)

    shape_variants = shapes.parse(raw.get("shapes"), raw.get("inputs") or {}, where, problems)
    if "error" not in signature:
        shapes.check(signature, raw.get("inputs") or {}, inputs, shape_variants, where, problems,
                     _check_against_model)
    if problems:
        return None, list(problems)
    spec = ModelSpec(name=name, spec_path=spec_path.resolve(), source=source,
                     source_sha256=source_sha, inputs=tuple(inputs), tolerance=tolerance,
                     opset=opset, description=str(raw.get("description", "")),
                     licenses=tuple(p.resolve() for p in licenses), signature=signature,
                     release=release, skip=tuple(sorted((k, " ".join(v.split()))
                                                        for k, v in skip.items())),
                     variants=variants, preprocessing=preprocessing,
                     source_format=sources.source_format(source), tvm=tvm, ship=ship)
    return shapes.expand(spec, shape_variants), []


def _release(raw, signature: dict, where: str, problems: _Problems) -> dict:
    """The optional `release:` section: waivers for artifacts not validated on their own bytes,
    and the I/O contract that the model file cannot say (layout, pre/postprocessing) per tensor:

        release:
          waivers: [{abi: NAME, reason: TEXT, target: NAME?, status: twin-passed?}]
          io: {x: {layout: NCHW, preprocessing: TEXT}, y: {layout: NC, postprocessing: TEXT}}
    """
    where = f"{where}: release"
    if raw is None:
        return {"waivers": [], "io": {}}
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with waivers and/or io")
        return {}
    problems.unknown(where, raw, _RELEASE_KEYS)
    waivers = raw.get("waivers") or []
    if not isinstance(waivers, list):
        problems.append(f"{where}.waivers: expected a list of {{abi, reason}} mappings")
        waivers = []
    for k, waiver in enumerate(waivers):
        ww = f"{where}.waivers[{k}]"
        if not isinstance(waiver, dict):
            problems.append(f"{ww}: expected a mapping with abi and reason")
            continue
        problems.unknown(ww, waiver, _WAIVER_KEYS)
        for key in ("abi", "reason"):
            if not isinstance(waiver.get(key), str) or not waiver[key].strip():
                problems.append(f"{ww}.{key}: required, a non-empty string")
        for key in ("target", "status"):
            if key in waiver and not isinstance(waiver[key], str):
                problems.append(f"{ww}.{key}: expected a string, got {waiver[key]!r}")
    io = raw.get("io") or {}
    if not isinstance(io, dict):
        problems.append(f"{where}.io: expected a mapping of tensor name -> layout, pre/postprocessing")
        io = {}
    kinds = {t["name"]: kind for kind in _IO_KEYS for t in signature.get(kind, [])}
    for name, body in io.items():
        iw = f"{where}.io.{name}"
        if signature and name not in kinds:
            problems.append(f"{iw}: the model has no input or output named {name!r} "
                            f"(it has: {', '.join(kinds)})")
        elif not isinstance(body, dict) or not all(isinstance(v, str) for v in body.values()):
            problems.append(f"{iw}: expected a mapping of strings (layout, pre/postprocessing)")
        elif name in kinds:
            problems.unknown(iw, body, _IO_KEYS[kinds[name]])
    return {"waivers": [dict(w) for w in waivers if isinstance(w, dict)],
            "io": {str(k): dict(v) for k, v in io.items() if isinstance(v, dict)}}


def _test_data(raw, spec_path: Path, where: str, problems: _Problems) -> TestData | None:
    if raw is None:
        return TestData("random", 0, 0.0, 1.0)
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in ("random", "file"):
        problems.append(f"{where}.test_data: expected exactly one of "
                        f"{{random: {{seed, low, high}}}} or {{file: sample.npy}}")
        return None
    kind, body = next(iter(raw.items()))
    if kind == "file":
        path = (spec_path.parent / str(body)).resolve()
        if not path.is_file():
            problems.append(f"{where}.test_data.file: file not found: {path}")
            return None
        if path.suffix != ".npy":
            problems.append(f"{where}.test_data.file: expected a .npy file, got {path.name}")
            return None
        return TestData("file", file=path)
    body = body or {}
    if not isinstance(body, dict):
        problems.append(f"{where}.test_data.random: expected a mapping with seed, low, high")
        return None
    problems.unknown(f"{where}.test_data.random", body, _RANDOM_KEYS)
    seed = _number(body.get("seed", 0), f"{where}.test_data.random.seed", problems, kind=int, minimum=0)
    low = _number(body.get("low", 0.0), f"{where}.test_data.random.low", problems)
    high = _number(body.get("high", 1.0), f"{where}.test_data.random.high", problems)
    if None in (seed, low, high):
        return None
    if high < low:
        problems.append(f"{where}.test_data.random: high ({high}) is below low ({low})")
        return None
    return TestData("random", seed, low, high)


def _check_against_model(signature: dict, raw_inputs: dict, inputs: list[InputSpec], where: str,
                         problems: _Problems) -> None:
    model_inputs = {i["name"]: i for i in signature["inputs"]}
    for name in raw_inputs:
        if name not in model_inputs:
            problems.append(f"{where}: inputs.{name}: the model has no input named {name!r} "
                            f"(it has: {', '.join(model_inputs)})")
    for name, info in model_inputs.items():
        if name not in raw_inputs:
            dims = ["?" if d is None else d for d in info["dims"]]
            problems.append(f"{where}: inputs: model input {name!r} {dims} is not declared; "
                            f"bind its shape (every dynamic dim) under inputs.{name}.shape")
    for spec in inputs:
        info = model_inputs.get(spec.name)
        if info is None:
            continue
        iw = f"{where}: inputs.{spec.name}"
        if len(spec.shape) != len(info["dims"]):
            problems.append(f"{iw}.shape: rank {len(spec.shape)} does not match the model's rank "
                            f"{len(info['dims'])} (model dims: {info['dims']})")
        else:
            for k, (want, have) in enumerate(zip(spec.shape, info["dims"])):
                if isinstance(have, int) and have > 0 and want != have:
                    problems.append(f"{iw}.shape[{k}]: {want} contradicts the model's fixed dim {have}")
        if info["dtype"] != spec.dtype:
            problems.append(f"{iw}.dtype: {spec.dtype} does not match the model's {info['dtype']}")


def model_signature(source: Path, sha256: str, memo_dir: Path | None) -> dict:
    """Inputs, outputs and opset of an ONNX file, memoised by its sha256 (importing onnx is slow)."""
    memo = memo_dir / "signatures" / f"{sha256}.json" if memo_dir else None
    if memo and memo.is_file():
        cached = json.loads(memo.read_text())
        if cached.get("version") == SIGNATURE_VERSION:
            return cached["signature"]
    signature = read_signature(source)
    if memo:
        atomic_write_text(memo, canonical_json({"version": SIGNATURE_VERSION, "signature": signature}))
    return signature


def read_signature(source: Path) -> dict:
    if sources.source_format(source) != "onnx":
        return sources.read_signature(source)
    import onnx  # heavy: only when the memo misses
    try:
        model = onnx.load(str(source), load_external_data=False)
    except Exception as exc:  # protobuf raises its own DecodeError, among others
        return {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    if model.ir_version <= 0 or not model.graph.node:
        return {"error": "no ONNX graph in the file (ir_version or nodes missing)"}
    initializers = {t.name for t in model.graph.initializer}

    def describe(values):
        out = []
        for v in values:
            if v.name in initializers:
                continue
            tt = v.type.tensor_type
            dims = []
            for d in tt.shape.dim:
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(int(d.dim_value))
                else:
                    dims.append(d.dim_param or None)
            out.append({"name": v.name, "dtype": ONNX_DTYPES.get(tt.elem_type, f"onnx:{tt.elem_type}"),
                        "dims": dims})
        return out

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output),
            "opset": int(opset), "graph_name": model.graph.name}


def load_models(models_dir: Path, memo_dir: Path | None = None) -> tuple[ModelSpec, ...]:
    """Every models/<name>/model.yaml, validated; raises SpecError listing all problems."""
    models_dir = Path(models_dir)
    if not models_dir.is_dir():
        raise SpecError([f"{models_dir}: models folder not found"])
    specs, problems = [], []
    for spec_path in sorted(models_dir.glob("*/model.yaml")):
        spec, found = load_model(spec_path, memo_dir)
        problems += found
        if spec and not found:
            specs.extend(spec)  # the model, then its shape variants
    for folder in sorted(p for p in models_dir.iterdir() if p.is_dir()):
        if not (folder / "model.yaml").is_file() and not folder.name.startswith("."):
            problems.append(f"{folder}: no model.yaml (every folder under models/ is one model)")
    if problems:
        raise SpecError(problems)
    return tuple(specs)


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class AbiSpec:
    """One compiled form of a model for a target: a compiler backend, a device, how to run it.

    backend llvm-cpu:     arch, triple, cpu, cpu_features; run.via python (this machine) | qemu
    backend vulkan-spirv: vulkan_target, vulkan_features (replaces the target's SPIR-V version
                          and capabilities, e.g. for Vulkan 1.1 drivers); run.via vulkan (run the
                          artifact itself on run.driver) | twin (the artifact cannot run here:
                          validate a twin compiled for run.twin from the same static model)
    """
    name: str
    compiler: str
    backend: str
    flags: tuple[str, ...]
    run: dict
    arch: str | None = None
    triple: str | None = None
    cpu: str | None = None
    cpu_features: tuple[str, ...] = ()
    vulkan_target: str | None = None
    vulkan_features: str | None = None

    def compile_config(self) -> dict:
        if self.backend == "vulkan-spirv":
            return {"compiler": self.compiler, "backend": self.backend,
                    "vulkan_target": self.vulkan_target, "vulkan_features": self.vulkan_features,
                    "flags": list(self.flags)}
        return {"compiler": self.compiler, "backend": self.backend, "arch": self.arch,
                "triple": self.triple, "cpu": self.cpu, "cpu_features": list(self.cpu_features),
                "flags": list(self.flags)}

    def twin_config(self) -> dict:
        """The compile config of the runnable twin: same flags, the twin's Vulkan target."""
        return {**self.compile_config(), "vulkan_target": self.run["twin"], "vulkan_features": None}


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    abis: tuple[AbiSpec, ...]
    fallback: tuple[str, ...]   # the order an app tries the ABIs in
    path: Path
    sha256: str
    tvm_abis: tuple = ()        # tvm_compile.TvmAbi: `compiler: tvm` ABIs (abis holds IREE's)
    ship: tuple = ()            # choice.parse_target(): slots of ABIs, one of which ships

    @property
    def all_abis(self) -> tuple:
        return self.abis + self.tvm_abis


_TARGET_KEYS = {"description", "abis", "fallback", "ship"}
_CPU_KEYS = {"compiler", "backend", "arch", "triple", "cpu", "cpu_features", "flags", "run"}
_VULKAN_KEYS = {"compiler", "backend", "vulkan_target", "vulkan_features", "flags", "run"}
_RUN_KEYS = {"llvm-cpu": {"via", "device", "qemu_cpu"}, "vulkan-spirv": {"via", "driver", "twin"}}
_ARCHES = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}
BACKENDS = ("llvm-cpu", "vulkan-spirv")


def known_targets(targets_dir: Path = TARGETS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(targets_dir).glob("*.yaml"))


def load_target(name: str, targets_dir: Path = TARGETS_DIR, memo_dir: Path | None = None) -> TargetSpec:
    targets_dir = Path(targets_dir)
    known = known_targets(targets_dir)
    if name not in known:
        raise PipelineError(f"unknown target {name!r}; known targets: {', '.join(known)}",
                            stage="spec", hint=f"say target=NAME with a known name, or add "
                                               f"{display(targets_dir / name)}.yaml")
    path = targets_dir / f"{name}.yaml"
    problems = _Problems()
    raw = _read_yaml(path, problems)
    where = display(path)
    abis = []
    fallback = ()
    ship = ()
    if isinstance(raw, dict):
        problems.unknown(where, raw, _TARGET_KEYS)
        if not isinstance(raw.get("abis"), dict) or not raw["abis"]:
            problems.append(f"{where}: abis: expected a non-empty mapping of ABI name -> definition")
        for abi_name, body in (raw.get("abis") or {}).items():
            abi = _abi(str(abi_name), body, f"{where}: abis.{abi_name}", problems, memo_dir)
            if abi:
                abis.append(abi)
        names = [a for a in (raw.get("abis") or {})] if isinstance(raw.get("abis"), dict) else []
        fallback = raw.get("fallback", names)
        if not isinstance(fallback, list) or sorted(map(str, fallback)) != sorted(names):
            problems.append(f"{where}: fallback: must list every ABI exactly once, in the order an "
                            f"app should try them (ABIs: {', '.join(names)}; got {fallback!r})")
        fallback = tuple(str(f) for f in fallback) if isinstance(fallback, list) else ()
        from .choice import parse_target
        native = {a.name for a in abis if a.run.get("via") in ("python", "vulkan")}
        ship = parse_target(raw.get("ship"), names, native, where, problems)
    elif not problems:
        problems.append(f"{where}: expected a mapping at the top level")
    if problems:
        raise SpecError(list(problems))
    return TargetSpec(name, str(raw.get("description", "")),
                      tuple(a for a in abis if a.compiler == "iree"), fallback, path,
                      sha256_file(path), tvm_abis=tuple(a for a in abis if a.compiler == "tvm"),
                      ship=ship)


def _strings(body: dict, key: str, where: str, problems: _Problems) -> tuple[str, ...]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}.{key}: expected a list of strings")
        return ()
    return tuple(value)


def _abi(name: str, body, where: str, problems: _Problems, memo_dir: Path | None) -> AbiSpec | None:
    if not NAME_RE.match(name):
        problems.append(f"{where}: ABI name must match {NAME_RE.pattern}")
    if not isinstance(body, dict):
        problems.append(f"{where}: expected a mapping")
        return None
    if body.get("compiler") == "tvm":
        from .tvm_compile import parse_abi
        return parse_abi(name, body, where, problems)
    before = len(problems)
    backend = body.get("backend")
    if body.get("compiler") != "iree":
        problems.append(f"{where}.compiler: expected 'iree' or 'tvm', got {body.get('compiler')!r}")
    if backend not in BACKENDS:
        problems.append(f"{where}.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        return None
    problems.unknown(where, body, _CPU_KEYS if backend == "llvm-cpu" else _VULKAN_KEYS)
    run = body.get("run")
    if not isinstance(run, dict):
        problems.append(f"{where}.run: expected a mapping saying how to run the artifact here")
        run = {}
    problems.unknown(f"{where}.run", run, _RUN_KEYS[backend])
    flags = _strings(body, "flags", where, problems)
    if backend == "llvm-cpu":
        for key in ("arch", "cpu"):
            if key not in body:
                problems.append(f"{where}: missing required key {key!r}")
        arch = body.get("arch")
        if arch is not None and arch not in _ARCHES:
            problems.append(f"{where}.arch: {arch!r} is not one of {', '.join(_ARCHES)}")
        via = run.get("via")
        if via not in ("python", "qemu"):
            problems.append(f"{where}.run.via: expected 'python' (this machine's IREE runtime) or "
                            f"'qemu' (the target's own runtime under qemu-user), got {via!r}")
        if via == "qemu" and arch != "aarch64":
            problems.append(f"{where}.run.via: qemu runs aarch64 artifacts only (arch is {arch!r})")
        if via == "python" and arch != "x86_64":
            problems.append(f"{where}.run.via: python runs this machine's (x86_64) artifacts only")
        features = _strings(body, "cpu_features", where, problems)
        if len(problems) > before:
            return None
        return AbiSpec(name=name, compiler="iree", backend=backend, flags=flags,
                       arch=arch, triple=body.get("triple", _ARCHES[arch]), cpu=str(body["cpu"]),
                       cpu_features=features,
                       run={"via": via, "device": run.get("device", "local-task"),
                            **({"qemu_cpu": run.get("qemu_cpu", "max")} if via == "qemu" else {})})
    # vulkan-spirv
    target = body.get("vulkan_target")
    if not isinstance(target, str) or not target:
        problems.append(f"{where}: missing required key 'vulkan_target' (an IREE Vulkan target "
                        f"name, e.g. valhall3 for the Mali-G610)")
    features = body.get("vulkan_features")
    if features is not None and not isinstance(features, str):
        problems.append(f"{where}.vulkan_features: expected a string such as 'spirv:v1.3,cap:Shader'")
    via = run.get("via")
    if via not in ("vulkan", "twin"):
        problems.append(f"{where}.run.via: expected 'vulkan' (run the artifact itself here) or "
                        f"'twin' (validate a twin built for run.twin), got {via!r}")
    if via == "twin" and not isinstance(run.get("twin"), str):
        problems.append(f"{where}.run.twin: name the Vulkan target of the runnable twin (e.g. llvmpipe)")
    driver = run.get("driver", "lavapipe")
    if len(problems) > before:
        return None
    for checked in ([target] + ([run["twin"]] if via == "twin" else [])):
        why = vulkan_target_problem(checked, features if checked == target else None, memo_dir)
        if why:
            problems.append(f"{where}: vulkan_target {checked!r}: {why}")
    if len(problems) > before:
        return None
    return AbiSpec(name=name, compiler="iree", backend=backend, flags=flags,
                   vulkan_target=target, vulkan_features=features,
                   run={"via": via, "driver": driver, **({"twin": run["twin"]} if via == "twin" else {})})


_PROBE_MLIR = """func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def vulkan_target_problem(target: str, features: str | None, memo_dir: Path | None) -> str | None:
    """Ask the installed IREE compiler whether it knows a Vulkan target (memoised per IREE version)."""
    import importlib.metadata
    import subprocess
    import tempfile
    version = importlib.metadata.version("iree-base-compiler")
    key = sha256_text(canonical_json({"iree": version, "target": target, "features": features}))
    memo = memo_dir / "vulkan_targets" / f"{key}.json" if memo_dir else None
    if memo and memo.is_file():
        return json.loads(memo.read_text())["problem"]
    from iree.compiler.tools.binaries import find_tool
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.mlir"
        src.write_text(_PROBE_MLIR)
        argv = [find_tool("iree-compile"), str(src), "--iree-hal-target-device=vulkan",
                f"--iree-vulkan-target={target}", "-o", str(Path(tmp) / "probe.vmfb")]
        if features:
            argv.insert(-2, f"--iree-vulkan-target-features={features}")
        proc = subprocess.run(argv, capture_output=True, text=True)
    problem = None
    if proc.returncode != 0:
        lines = [l for l in proc.stderr.splitlines() if "error" in l] or proc.stderr.splitlines() or ["?"]
        detail = lines[0].split("error:", 1)[-1].strip()
        problem = (f"IREE {version} rejects it ({detail}); Mali-G610 is 'valhall3', "
                   f"VideoCore VII is 'videocore_vii', lavapipe runs 'llvmpipe'")
    if memo:
        atomic_write_text(memo, canonical_json({"problem": problem}))
    return problem


def fingerprint(obj) -> str:
    return sha256_text(canonical_json(obj))
