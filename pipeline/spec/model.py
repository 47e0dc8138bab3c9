"""models/*/model.yaml -> frozen, validated ModelSpecs (targets: target.py).

The document's structure is checked by strict pydantic models (the JSON Schema in docs/schema/
is exported from them); what needs the files (the source's sha256 and signature, licenses,
data sets) is checked here. Every problem found is collected and reported at once, naming the
file and the key, before anything is built. A source's signature is read without onnx
(onnx_signature.py) and memoised by the source's sha256.
"""
from __future__ import annotations

import difflib
import hashlib
import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal, Optional

from pydantic import BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from .onnx_signature import external_data as read_external_data
from .onnx_signature import read_signature as read_onnx_signature
from .shapes import check as check_shapes, expand as expand_shapes, parse as parse_shapes
from .sources import read_signature as read_source_signature, source_files, source_format, source_sha256
from .calibration import PreprocessingDoc
from .common import (NAME_RE, Doc, Says, Tolerance, ToleranceDoc, as_list, display, inside,
                     links_out, one_or_many, read_yaml, validate)
from .npu import NpuModelDoc
from .postprocess import VERSION as POSTPROCESS_VERSION
from .postprocess import PostprocessDoc, find_cut
from .shapes import Shapes
from .ship import ModelShip
from .ship import parse_model as parse_ship
from .tvm import TvmDoc
from .tvm import parse_model as parse_tvm
from .variants import Variants
from .variants import parse as parse_variants
from ..core.errors import SpecError, unknown_keys
from ..core.numerics import integer_max_abs_problem
from ..core.store import atomic_write_text, canonical_json, sha256_file

DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
NonEmpty = Annotated[str, Field(pattern=r"\S"), Says("required, a non-empty string")]
DEFAULT_OPSET = 17
SIGNATURE_VERSION = 4  # 3: a TFLite source's resource variables as state inputs/outputs; 4: defaults
EXTERNAL_VERSION = 2

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
    variants: tuple = ()  # precision variants (variants.VariantSpec), see pipeline/spec/variants.py
    preprocessing: dict = field(default_factory=dict, compare=False, hash=False)  # input -> calibration.Preprocessing
    source_format: str = "onnx"   # onnx | tflite | nnef (see sources.py)
    external_data: tuple[str, ...] = ()  # an ONNX source's external-data files, beside it (sources.py)
    shape_of: str | None = None   # a shape variant `base.shape` of model `base` (see shapes.py)
    shape: str | None = None
    shapes: tuple = ()            # on the base model: the names of its shape variants' specs
    tvm: dict = field(default_factory=dict, compare=False, hash=False)  # tvm_tune.parse_model()
    ship: dict = field(default_factory=dict, compare=False, hash=False)  # choice.parse_model()
    npu: dict = field(default_factory=dict, compare=False, hash=False)  # {budget_s} when the spec sets it
    postprocess: dict = field(default_factory=dict, compare=False, hash=False)  # see _postprocess()

    @property
    def base(self) -> str:
        """The model whose source (and import step) this spec shares."""
        return self.shape_of or self.name

    def skip_reason(self, abi: str) -> str | None:
        """Why this model is not built for `abi` (a declared, recorded decision), or None."""
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


# ----------------------------------------------------------------------------- model.yaml
def _text(value):
    """YAML reads a hash of digits only as a number: take it as text (a mismatch then says so)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class SourceDoc(Doc):
    """The model file the artifacts are built from."""
    path: str
    """relative to the model folder, and inside it: an .onnx or .tflite file, or an NNEF graph
    folder"""
    sha256: Annotated[str, BeforeValidator(_text)]
    """sha256sum of the file (of an NNEF folder, or of an ONNX file with external data: of all
    its files, see docs/sources.md); a mismatch is a spec error"""


class RandomDoc(Doc):
    """Uniform random test data."""
    seed: Annotated[int, Field(ge=0)] = 0
    low: float = 0.0
    high: float = 1.0

    @model_validator(mode="after")
    def _range(self):
        if self.low is not None and self.high is not None and self.high < self.low:
            raise PydanticCustomError("range", "high ({high}) is below low ({low})",
                                      {"high": self.high, "low": self.low})
        return self


class TestDataDoc(Doc):
    """The input that golden outputs are computed and artifacts validated on: exactly one of
    `random` and `file`."""
    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})
    random: Optional[RandomDoc] = None
    """uniform random values (default: seed 0, low 0, high 1)"""
    file: str = None
    """a .npy file in the model folder (relative to it), an array of exactly the input's shape
    and dtype"""

    @model_validator(mode="after")
    def _one(self):
        if len(self.model_fields_set) != 1:
            raise PydanticCustomError("one_of", "expected exactly one of {random: {seed, low, "
                                      "high}} or {file: sample.npy}")
        return self


Dim = Annotated[int, Field(gt=0),
                Says("unbound dynamic dim {input}: every dim must be a positive integer")]


class InputDoc(Doc):
    """One input of the model, bound to a fixed shape."""
    shape: list[Dim]
    """every dim a positive integer (binds the model's dynamic dims)"""
    dtype: Literal[DTYPES] = "float32"
    """must be the model's"""
    test_data: Optional[TestDataDoc] = None
    """default: random: {seed: 0, low: 0, high: 1}"""
    value: Optional[float] = None
    """binds the input to one value (every element; instead of test_data): an integer input so
    bound (a sample rate, a mode flag) is a constant the static stage folds before compiling
    (`fold-constant-if`: the artifact is specialised to it); a float input keeps it as its test
    data only. `doit new ... value=sr:16000` writes it"""


class WaiverDoc(Doc):
    """Ship an artifact whose validation status is not "passed" (recorded in the release)."""
    abi: NonEmpty
    reason: NonEmpty
    target: str = None
    """only on this target (default: every target)"""
    status: str = None
    """only with this validation status, e.g. twin-passed (default: any)"""


class IoDoc(Doc):
    """What the model file cannot say about one input or output."""
    layout: str = None
    """e.g. NCHW"""
    preprocessing: str = None
    """inputs: how the app makes the tensor"""
    postprocessing: str = None
    """outputs: how the app reads the tensor"""


class ReleaseDoc(Doc):
    """Read by `doit release` only."""
    waivers: Optional[list[WaiverDoc]] = None
    io: Optional[dict[str, IoDoc]] = None
    """per input or output name of the model"""


class ModelDoc(Doc):
    """models/<name>/model.yaml: one model, the checks its artifacts must pass, its variants."""
    model_config = ConfigDict(title="model.yaml")
    description: str = ""
    """one line for people"""
    source: SourceDoc
    """the model file and its sha256"""
    license: Optional[one_or_many(str)] = None
    """a file name or a list of them, in the model folder (relative to it, never a link out of
    it); they ship in releases"""
    inputs: dict[str, InputDoc]
    """every model input, by name"""
    tolerance: ToleranceDoc
    """how close every artifact's outputs must be to the golden outputs"""
    opset: Annotated[int, Field(ge=11)] = DEFAULT_OPSET
    """ONNX opset the model is upgraded to before compiling"""
    release: Optional[ReleaseDoc] = None
    """the I/O contract the model file cannot say, and waivers: read by `doit release`"""
    skip: Optional[dict[str, Annotated[str, Field(pattern=r"\S"), Says(
        "expected why this model is not built for these ABIs, got {input}: a skip without a "
        "reason is not allowed")]]] = None
    """ABI name pattern (fnmatch, e.g. 'vulkan-*') -> why this model is not built for it; a
    pattern that names no ABI of any known target is an error (nothing would be skipped)"""
    preprocessing: Optional[dict[str, PreprocessingDoc]] = None
    """input name -> how an image of a data set becomes that input (see docs/variants.md)"""
    variants: Optional[Variants] = None
    """precision variants by name, each built as <model>.<name> (see docs/variants.md)"""
    shapes: Optional[Shapes] = None
    """more fixed input shapes by name, each built as <model>.<name>"""
    tvm: Optional[TvmDoc] = None
    """TVM tuning budgets and pinned databases per target (see docs/tvm.md)"""
    ship: Optional[ModelShip] = None
    """target -> {slot: the ABI that ships}, e.g. {rk3588: {cpu: cpu-aarch64-tvm}}"""
    npu: Optional[NpuModelDoc] = None
    """this model's builds for NPU ABIs (RKNN-Toolkit2): its time budget (see docs/npu.md)"""
    postprocess: Optional[PostprocessDoc] = None
    """a detector's data-dependent post-processing (NMS, NonZero, TopK with K from data) cut off
    the artifact and shipped as postprocess.onnx for the host; validated on detections (see
    docs/postprocess.md)"""


def load_model(spec_path: Path, memo_dir: Path | None = None) -> tuple[list[ModelSpec] | None, list[str]]:
    """Parse and check one model spec; returns ([spec, its shape variants...] or None, problems)."""
    problems = []
    name, folder = spec_path.parent.name, spec_path.parent
    where = display(spec_path)
    if not NAME_RE.match(name):
        problems.append(f"{folder}: model folder name must match {NAME_RE.pattern}")
    raw = read_yaml(spec_path, problems)
    if raw is None:
        return None, problems or [f"{where}: empty file"]
    doc = validate(ModelDoc, raw, where, problems)
    if doc is None:
        return None, problems
    source, source_sha, external = _source(doc.source, folder, where, problems, memo_dir)
    licenses = []
    for item in as_list(doc.license):
        path = inside(folder, item, f"{where}: license", problems)
        if path is None:
            continue
        if not path.is_file():
            problems.append(f"{where}: license: file not found: {path}")
        licenses.append(path)
    inputs, postprocess = [], {}
    for in_name, body in (doc.inputs or {}).items():
        if body is not None and body.shape is not None and body.dtype is not None:
            test_data = (_value(body, f"{where}: inputs.{in_name}", problems) if body.value is not None
                         else _test_data(body.test_data, folder, f"{where}: inputs.{in_name}", problems))
            if test_data is not None:
                inputs.append(InputSpec(in_name, tuple(body.shape), body.dtype, test_data))
    tolerance = doc.tolerance.spec() if doc.tolerance else None

    # against the model itself
    declared = list(doc.inputs or {})
    signature = {}
    if source is not None:
        signature = model_signature(source, source_sha, memo_dir)
        fmt = source_format(source)
        if "error" in signature:
            problems.append(f"{where}: source.path: {source.name} is not a readable "
                            f"{ {'onnx': 'ONNX model', 'tflite': 'TFLite model', 'nnef': 'NNEF graph'}[fmt]}: "
                            f"{signature['error']}")
        elif doc.inputs is not None:
            _check_against_model(signature, declared, inputs, where, problems)
        if "error" not in signature and doc.postprocess is not None:
            signature, postprocess = _postprocess(doc.postprocess, source, source_sha, fmt,
                                                  signature, where, problems, memo_dir)
        if "error" not in signature and tolerance is not None:
            _check_integer_tolerance(signature, tolerance, where, problems)
    release = _release(doc.release, signature, where, problems)
    preprocessing, variants = parse_variants(doc.preprocessing, doc.variants, folder,
                                             {n: None for n in declared} | {
                                                 i.name: (i.shape, i.dtype) for i in inputs},
                                             tolerance, where, problems)
    tvm = parse_tvm(doc.tvm, folder, where, problems)
    shape_variants = parse_shapes(doc.shapes, declared, where, problems)
    if "error" not in signature:
        check_shapes(signature, declared, inputs, shape_variants, where, problems,
                     _check_against_model)
    if problems:
        return None, list(problems)
    spec = ModelSpec(name=name, spec_path=spec_path.resolve(), source=source,
                     source_sha256=source_sha, inputs=tuple(inputs), tolerance=tolerance,
                     opset=doc.opset, description=doc.description,
                     licenses=tuple(p.resolve() for p in licenses), signature=signature,
                     release=release, skip=tuple(sorted((k, " ".join(v.split()))
                                                        for k, v in (doc.skip or {}).items())),
                     variants=variants, preprocessing=preprocessing,
                     source_format=source_format(source), external_data=external, tvm=tvm,
                     ship=parse_ship(doc.ship),
                     npu=doc.npu.model_dump(exclude_none=True) if doc.npu else {},
                     # "model": whose static stage writes postprocess.onnx (the split of the
                     # imported graph, the same for its shape and precision variants)
                     postprocess={**postprocess, "model": name} if postprocess else {})
    return expand_shapes(spec, shape_variants), []


def _postprocess(doc: PostprocessDoc, source: Path, sha256: str, fmt: str, signature: dict,
                 where: str, problems: list, memo_dir: Path | None) -> tuple[dict, dict]:
    """(the signature the artifact has, the cut) for `postprocess:`: the artifact's outputs are
    the cut tensors (golden, validate and release read them from the signature), the model's own
    outputs move to `postprocess_outputs`. The cut is found in the graph (spec/postprocess.py),
    memoised by the source's sha256 and the spec's cut."""
    pw = f"{where}: postprocess"
    if fmt != "onnx":
        problems.append(f"{pw}: cutting the post-processing is for ONNX sources; this one is "
                        f"{fmt} (convert it to ONNX, or cut it before conversion)")
        return signature, {}
    named = None if doc.cut == "auto" else list(doc.cut)
    key = hashlib.sha256(canonical_json({"source": sha256, "cut": named}).encode()).hexdigest()

    def compute():
        import onnx  # onnx: 1.5 s, only for specs with postprocess (memoised)
        return find_cut(onnx.load(str(source)), named)
    found = _memoised(memo_dir, "postprocess", key, POSTPROCESS_VERSION, compute)
    if "error" in found:
        problems.append(f"{pw}.cut: {found['error']}")
        return signature, {}
    outputs = [dict(c, dims=[d if d is not None else "?" for d in c["dims"]]) for c in found["cut"]]
    return ({**signature, "outputs": outputs, "postprocess_outputs": signature["outputs"]},
            {"cut": [c["name"] for c in found["cut"]], "outputs": found["outputs"],
             "inputs": found["inputs"], "ops": found["ops"], "iou": doc.iou,
             "score_abs": doc.score_abs, "auto": named is None})


INTEGER_DTYPES = ("int64", "int32", "int8", "uint8", "int16", "uint16", "uint32", "uint64")


def _check_integer_tolerance(signature: dict, tolerance: Tolerance, where: str, problems: list):
    """A max_abs of 1 or more judges an integer output in steps (core.numerics.integer_steps):
    one that is no whole number of steps, with no integer_steps to say how many, is refused
    here, before anything is built, when the model's outputs show an integer one."""
    integer = [o["name"] for o in signature.get("outputs", []) if o.get("dtype") in INTEGER_DTYPES]
    problem = integer and integer_max_abs_problem("tolerance", tolerance.as_dict())
    if problem:
        problems.append(f"{where}: {problem} (integer outputs: {', '.join(integer)})")


def _source(doc: SourceDoc | None, folder: Path, where: str, problems: list,
            memo_dir: Path | None = None):
    """(the source, its sha256, its external-data files) if it exists inside the model folder, is
    a source and matches its sha256, else (None, None, ())."""
    none = None, None, ()
    if doc is None or doc.path is None:
        return none
    source = inside(folder, doc.path, f"{where}: source.path", problems)
    if source is None:
        return none
    if not source.exists():
        problems.append(f"{where}: source.path: file not found: {source}")
        return none
    fmt = source_format(source)
    if fmt is None:
        problems.append(f"{where}: source.path: a source is an .onnx or .tflite file or "
                        f"an NNEF graph folder (got {source.suffix or 'no extension'})")
        return none
    external = ()
    if fmt == "nnef" and not links_out(folder, source_files(source).values(),
                                       f"{where}: source.path", problems):
        return none
    if fmt == "onnx":
        external = _external_data(source, folder, where, problems, memo_dir)
        if external is None:
            return none
    if doc.sha256 is not None:
        actual = source_sha256(source, external)
        if doc.sha256.lower() == actual:
            return source, actual, external
        covers = (f" (the sha256 of an ONNX model with external data covers the .onnx and "
                  f"{', '.join(external)}: see docs/sources.md)" if external else "")
        problems.append(f"{where}: source.sha256: mismatch for {source.name}: spec says "
                        f"{doc.sha256}, file is {actual}{covers}")
    return none


def _external_data(source: Path, folder: Path, where: str, problems: list,
                   memo_dir: Path | None) -> tuple[str, ...] | None:
    """The external-data files an ONNX source's tensors name (`location`, relative to the .onnx's
    folder: onnx and onnxruntime refuse any other), each there and inside the model folder; None
    when one is not. They are part of the source: hashed with it, inputs of its import step."""
    locations, ok = [], True
    for location in _external_locations(source, memo_dir):
        lw = f"{where}: source.path: external data of {source.name}"
        rel = PurePosixPath(location)
        if not location or rel.is_absolute() or ".." in rel.parts:
            problems.append(f"{lw}: location {location!r} is not a path below the folder of "
                            f"{source.name} (onnx and onnxruntime refuse it): save the model with "
                            f"its external data beside it, in the model folder")
            ok = False
        elif not (source.parent / rel).is_file():
            problems.append(f"{lw}: file not found: {source.parent / rel}")
            ok = False
        elif links_out(folder, [source.parent / rel], lw, problems):
            locations.append(rel.as_posix())
        else:
            ok = False
    return tuple(sorted(set(locations))) if ok else None


def _memoised(memo_dir: Path | None, kind: str, sha256: str, version: int, compute):
    """compute(), kept in memo_dir/kind/<sha256>.json for the file of that sha256 (reading an
    ONNX file walks every node)."""
    memo = memo_dir / kind / f"{sha256}.json" if memo_dir else None
    if memo and memo.is_file():
        cached = json.loads(memo.read_text())
        if cached.get("version") == version:
            return cached["value"]
    value = compute()
    if memo:
        atomic_write_text(memo, canonical_json({"version": version, "value": value}))
    return value


def _external_locations(source: Path, memo_dir: Path | None) -> list[str]:
    """onnx_signature.external_data, memoised by the file's sha256."""
    return _memoised(memo_dir, "external", sha256_file(source), EXTERNAL_VERSION,
                     lambda: read_external_data(source))


def _release(doc: ReleaseDoc | None, signature: dict, where: str, problems: list) -> dict:
    """The optional `release:` section: waivers for artifacts not validated on their own bytes,
    and the I/O contract that the model file cannot say (layout, pre/postprocessing) per tensor.
    A tensor must be the model's; an input has no postprocessing, an output no preprocessing."""
    io = (doc.io if doc else None) or {}
    kinds = {t["name"]: kind for kind in _IO_KEYS for t in signature.get(kind, [])}
    for name, body in io.items():
        iw = f"{where}: release.io.{name}"
        if signature and name not in kinds:
            problems.append(f"{iw}: the model has no input or output named {name!r} "
                            f"(it has: {', '.join(kinds)})")
        elif body is not None and name in kinds:
            unknown_keys(problems, iw, body.model_dump(exclude_none=True), _IO_KEYS[kinds[name]])
    return {"waivers": [w.model_dump(exclude_none=True) for w in (doc.waivers if doc else None) or []
                        if w is not None],
            "io": {k: v.model_dump(exclude_none=True) for k, v in io.items() if v is not None}}


_IO_KEYS = {"inputs": {"layout", "preprocessing"}, "outputs": {"layout", "postprocessing"}}


def _value(body: InputDoc, where: str, problems: list) -> TestData | None:
    """An input bound to one value: test data that can take only it (random, low == high; the
    static stage reads an integer input so bound as a constant: stages/static.constant_value)."""
    v = body.value
    if body.test_data is not None:
        problems.append(f"{where}: give value or test_data, not both (value binds the input to one value)")
    elif body.dtype == "bool":
        problems.append(f"{where}.value: a bool input cannot be bound to a value here (give test_data)")
    elif body.dtype.startswith(("int", "uint")) and v != int(v):
        problems.append(f"{where}.value: {v:g} is not an integer, the input is {body.dtype}")
    else:
        v = int(v) if body.dtype.startswith(("int", "uint")) else v
        return TestData("random", 0, v, v)
    return None


def _test_data(doc: TestDataDoc | None, folder: Path, where: str, problems: list) -> TestData | None:
    if doc is None or doc.file is None:
        r = (doc.random if doc else None) or RandomDoc()
        return TestData("random", r.seed, r.low, r.high)
    path = inside(folder, doc.file, f"{where}.test_data.file", problems)
    if path is None:
        return None
    if not path.is_file():
        problems.append(f"{where}.test_data.file: file not found: {path}")
    elif path.suffix != ".npy":
        problems.append(f"{where}.test_data.file: expected a .npy file, got {path.name}")
    else:
        return TestData("file", file=path)
    return None


def _check_against_model(signature: dict, declared: list[str], inputs: list[InputSpec], where: str,
                         problems: list) -> None:
    # an input with an initializer (its default) is an input only where the spec declares it
    # (the static stage makes the others constants: initializer-inputs-as-constants)
    model_inputs = {i["name"]: i for i in signature["inputs"]
                    + [d for d in signature.get("defaults", ()) if d["name"] in declared]}
    for name in declared:
        if name not in model_inputs:
            problems.append(f"{where}: inputs.{name}: the model has no input named {name!r} "
                            f"(it has: {', '.join(model_inputs)})")
    for name, info in model_inputs.items():
        if name not in declared:
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
    return _memoised(memo_dir, "signatures", sha256, SIGNATURE_VERSION, lambda: read_signature(source))


def read_signature(source: Path) -> dict:
    """Inputs, outputs and opset of a source. ONNX is read by a small protobuf reader (no onnx
    import: loading stays cheap); TFLite and NNEF by their format's own parser."""
    if source_format(source) != "onnx":
        return read_source_signature(source)
    return read_onnx_signature(source)


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


