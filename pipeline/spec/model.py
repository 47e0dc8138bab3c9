"""models/*/model.yaml and the target registry -> frozen, validated specs.

Every problem found is collected and reported at once, naming the file and the key, before
anything is built. Reading a model's input signature needs onnx (slow to import), so it is
memoised by the source file's sha256.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import onnx_signature, shapes, sources
from .common import NAME_RE, Problems, Tolerance, display, number, read_yaml
from .ship import parse_model as parse_ship
from .tvm import parse_model as parse_tvm
from .variants import parse as parse_variants
from ..core.errors import SpecError
from ..core.store import atomic_write_text, canonical_json, sha256_file

DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
DEFAULT_OPSET = 17
SIGNATURE_VERSION = 1

# ----------------------------------------------------------------------------- model specs
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


def load_model(spec_path: Path, memo_dir: Path | None = None) -> tuple[list[ModelSpec] | None, list[str]]:
    """Parse and check one model spec; returns ([spec, its shape variants...] or None, problems)."""
    problems = Problems()
    name = spec_path.parent.name
    where = display(spec_path)
    if not NAME_RE.match(name):
        problems.append(f"{spec_path.parent}: model folder name must match {NAME_RE.pattern}")
    raw = read_yaml(spec_path, problems)
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
                    vals[key] = number(tol[key], f"{where}: tolerance.{key}", problems, minimum=0)
            if "cosine" in vals and vals["cosine"] is not None and vals["cosine"] > 1:
                problems.append(f"{where}: tolerance.cosine: a cosine similarity is at most 1")
            if len(vals) == 3 and None not in vals.values():
                tolerance = Tolerance(**vals)

    opset = raw.get("opset", DEFAULT_OPSET)
    opset = number(opset, f"{where}: opset", problems, kind=int, minimum=11)

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
    preprocessing, variants = parse_variants(raw, spec_path.parent, inputs, tolerance, where, problems)
    tvm = parse_tvm(raw.get("tvm"), spec_path.parent, where, problems)
    ship = parse_ship(raw.get("ship"), where, problems)

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


def _release(raw, signature: dict, where: str, problems: Problems) -> dict:
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


def _test_data(raw, spec_path: Path, where: str, problems: Problems) -> TestData | None:
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
    seed = number(body.get("seed", 0), f"{where}.test_data.random.seed", problems, kind=int, minimum=0)
    low = number(body.get("low", 0.0), f"{where}.test_data.random.low", problems)
    high = number(body.get("high", 1.0), f"{where}.test_data.random.high", problems)
    if None in (seed, low, high):
        return None
    if high < low:
        problems.append(f"{where}.test_data.random: high ({high}) is below low ({low})")
        return None
    return TestData("random", seed, low, high)


def _check_against_model(signature: dict, raw_inputs: dict, inputs: list[InputSpec], where: str,
                         problems: Problems) -> None:
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
    """Inputs, outputs and opset of a source. ONNX is read by a small protobuf reader (no onnx
    import: loading stays cheap); TFLite and NNEF by their format's own parser."""
    if sources.source_format(source) != "onnx":
        return sources.read_signature(source)
    return onnx_signature.read_signature(source)


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


