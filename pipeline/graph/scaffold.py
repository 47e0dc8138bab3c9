"""`doit new source=PATH name=NAME [shape=INPUT:1x3x224x224 ...] [value=INPUT:16000 ...]
[license=PATH]`: a model folder from a model file, with a spec that loads.

Reads the source's signature (spec.model.read_signature: ONNX without onnx, TFLite, NNEF), binds
every dim (the shapes given; a dynamic first dim is the batch: 1; a named dim takes the value it
got anywhere else), and writes models/NAME/ with a copy of the source (and its external-data
files, or the NNEF folder), the license if given, and model.yaml: the sha256, every input with
its dtype and bound shape, default test data (random, seed 0: [0, 1) for floats, 0..9 for
integers; an input given value= is bound to that value instead: `value:` in the spec, a constant
the static stage folds for an integer input, e.g. a sample rate the model checks) and the
default tolerance. A dim it cannot bind is an error naming each one by input, and nothing is
written. The folder is written beside its final place and renamed when its spec
has loaded (spec.model.load_model); an existing folder is never touched.
"""
from __future__ import annotations

import difflib
import json
import math
import re
import shutil
import sys
from pathlib import Path

from ..core.errors import PipelineError
from ..core.numerics import make_input
from ..rewrite.sources import tflite_run
from ..run.ort import session
from ..spec.common import NAME_RE
from ..spec.model import DTYPES, load_model, read_signature
from ..spec.sources import source_files, source_format, source_sha256

TOLERANCE = {"max_abs": "1.0e-4", "mean_abs": "1.0e-5", "cosine": "0.99999"}  # as YAML reads numbers
INT_RANGE = (0, 9)      # integer inputs: small non-negative values (valid ids, indices, flags)
FLOAT_RANGE = (0.0, 1.0)
# the dims follow the last ':' (a TFLite input is often named like serving_default_x:0)
_SHAPE = re.compile(r"^(?P<name>.+):(?P<dims>\d+(x\d+)*|)$")
HINT = ("give the whole shape of an input, e.g. shape=x:1x3x224x224, or the value of a named "
        "dim, e.g. shape=sequence:576 (several shape= are allowed)")


def parse_shapes(args: list[str]) -> dict[str, list[int]]:
    """['x:1x3x224x224', 'seq:16', 's:'] -> {'x': [1, 3, 224, 224], 'seq': [16], 's': []}; each
    argument may also hold several, comma-separated. The name ends at the last ':'
    ('serving_default_x:0:1x224x224x3': input 'serving_default_x:0')."""
    out = {}
    for arg in [a for item in args for a in item.split(",") if a]:
        m = _SHAPE.match(arg.strip())
        if not m:
            raise PipelineError(f"shape={arg}: expected NAME:DIMxDIMx... (e.g. x:1x3x224x224; "
                                f"a scalar input: x:)", stage="new", hint=HINT)
        out[m["name"]] = [int(d) for d in m["dims"].split("x")] if m["dims"] else []
    return out


def bind(inputs: list[dict], given: dict[str, list[int]]) -> tuple[dict, list[str]]:
    """Every input's shape with each dim bound: ({input: [dims]}, [the dims left unbound, one
    sentence each]). `given`: input name -> its whole shape, or a named dim -> [its value]."""
    names = {i["name"] for i in inputs}
    params = {d for i in inputs for d in i["dims"] if _named(d)}
    problems = []
    for key, dims in given.items():
        if key not in names and key not in params:
            problems.append(f"shape={key}:...: the model has no input and no named dim {key!r} "
                            f"(inputs: {', '.join(sorted(names))}"
                            + (f"; named dims: {', '.join(sorted(params))})" if params else ")")
                            + _meant(key, dims, names))
        elif key not in names and len(dims) != 1:
            problems.append(f"shape={key}:...: {key!r} is a named dim: give one value")
    values = {k: v[0] for k, v in given.items() if k not in names and len(v) == 1}
    for i in inputs:  # a whole shape given binds the named dims it covers
        shape = given.get(i["name"])
        if shape is not None and len(shape) == len(i["dims"]):
            for d, v in zip(i["dims"], shape):
                if _named(d):
                    values.setdefault(d, v)
    for i in inputs:  # a dynamic leading dim is the batch: 1, wherever its name appears
        if i["name"] not in given and len(i["dims"]) > 1 and _named(i["dims"][0]):
            values.setdefault(i["dims"][0], 1)
    shapes = {}
    for i in inputs:
        dims, shape = i["dims"], given.get(i["name"])
        if shape is not None:
            if len(shape) != len(dims):
                problems.append(f"input {i['name']!r}: shape {_text(shape)} has {len(shape)} dims, "
                                f"the model's has {len(dims)} ({_text(dims)})")
            fixed = [(k, d, s) for k, (d, s) in enumerate(zip(dims, shape)) if isinstance(d, int) and d != s]
            for k, d, s in fixed:
                problems.append(f"input {i['name']!r} dim {k}: the model fixes it to {d}, not {s}")
            for k, s in enumerate(shape):
                if s <= 0:
                    problems.append(f"input {i['name']!r} dim {k}: {s} is not a positive integer")
            shapes[i["name"]] = list(shape)
            continue
        bound, open_ = [], []
        for k, d in enumerate(dims):
            if isinstance(d, int):
                bound.append(d)
            elif _named(d) and d in values:
                bound.append(values[d])
            elif k == 0 and len(dims) > 1:
                bound.append(1)  # a dynamic leading dim is the batch
            else:
                bound.append(None)
                open_.append(f"dim {k} ({d!r})" if d else f"dim {k} (unnamed)")
        if open_:
            problems.append(f"input {i['name']!r} {_text(dims)}: cannot bind {', '.join(open_)}")
        shapes[i["name"]] = bound
    return shapes, problems


def _meant(key: str, dims: list[int], names: set[str]) -> str:
    """A guess at the input meant, when a name holds ':' (shape=x:0 with input 'x:0' read as
    input 'x', dims [0]), or is close to one."""
    whole = f"{key}:{'x'.join(map(str, dims))}"
    if whole in names:
        return f": is {whole!r} the input? then give its shape after it: shape={whole}:1x..."
    close = difflib.get_close_matches(key, sorted(names), n=1)
    return f": did you mean {close[0]!r}?" if close else ""


def _named(dim) -> bool:
    """A dim_param that names a dim ('batch', 'sequence'), not a placeholder ('?', '')."""
    return isinstance(dim, str) and dim not in ("", "?")


def _text(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


_VALUE = re.compile(r"^(?P<name>.+):(?P<value>[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)$")
VALUE_HINT = ("give an input's one value as value=NAME:NUMBER, e.g. value=sr:16000 (a scalar; "
              "every element of the input takes it)")


def parse_values(args: list[str], inputs: list[dict]) -> tuple[dict, list[str]]:
    """['sr:16000'] -> ({'sr': 16000}, problems): each input's one value (an integer for an
    integer input); the name ends at the last ':'."""
    dtypes, values, problems = {i["name"]: i["dtype"] for i in inputs}, {}, []
    for arg in [a for item in args for a in item.split(",") if a]:
        m = _VALUE.match(arg.strip())
        if not m:
            problems.append(f"value={arg}: expected NAME:NUMBER (e.g. sr:16000)")
            continue
        name, number = m["name"], float(m["value"])
        if name not in dtypes:
            problems.append(f"value={arg}: the model has no input {name!r} (inputs: "
                            f"{', '.join(sorted(dtypes))}){_meant(name, [], set(dtypes))}")
        elif dtypes[name] == "bool":
            problems.append(f"value={arg}: {name!r} is a bool input; a value binds numbers only")
        elif dtypes[name].startswith(("int", "uint")):
            if number != int(number):
                problems.append(f"value={arg}: {name!r} is {dtypes[name]}, {m['value']} is not an integer")
            else:
                values[name] = int(number)
        else:
            values[name] = number
    return values, problems


def test_data(dtype: str) -> dict:
    if dtype == "bool":
        return {"seed": 0}
    low, high = INT_RANGE if dtype.startswith(("int", "uint")) else FLOAT_RANGE
    return {"seed": 0, "low": low, "high": high}


def output_scale(source: Path, fmt: str, spec) -> float:
    """The largest |value| the source model outputs on the spec's test inputs (onnxruntime, or
    LiteRT for TFLite), the same inputs and reference the golden stage uses."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    feeds = {i.name: make_input(i.as_dict()) for i in spec.inputs}
    try:
        if fmt == "tflite":
            outs = list(tflite_run(source, feeds).values())
        else:
            outs = session(source).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - the golden stage says it again, with its hint
        raise PipelineError(f"{source.name} does not run on the test inputs "
                            f"{[list(a.shape) for a in feeds.values()]}: "
                            f"{str(exc).strip().splitlines()[-1]}", stage="new", model=spec.name,
                            hint="check the shapes given (shape=...); an input the model checks "
                                 "(a sample rate, a mode) takes its one value with value=NAME:NUMBER") from None
    return max((float(np.abs(np.asarray(o, dtype=np.float64)).max()) for o in outs if np.size(o)),
               default=1.0)


def tolerance_for(scale: float) -> dict:
    """Bounds for artifacts vs golden that scale with the outputs: float32 rounding through a
    deep network grows with the values (a landmark model outputs pixels, up to hundreds; a
    classifier, probabilities). max_abs 1e-5 and mean_abs 1e-6 of the largest output (at least
    1e-4 and 1e-5), rounded up to one digit; cosine 0.9999."""

    def up(x: float) -> str:
        exp = math.floor(math.log10(x))
        return f"{math.ceil(x / 10 ** exp - 1e-9)}.0e{exp:+03d}"
    return {"max_abs": up(max(1e-4, 1e-5 * scale)), "mean_abs": up(max(1e-5, 1e-6 * scale)),
            "cosine": "0.9999"}


def spec_text(name: str, source: Path, sha256: str, shapes: dict, dtypes: dict,
              licenses: list[str], tolerance: dict | None = None, scale: float | None = None,
              values: dict | None = None) -> str:
    """model.yaml, with the schema line editors read; strings quoted as JSON (valid YAML)."""
    q = json.dumps
    lines = ["# yaml-language-server: $schema=../../docs/schema/model.schema.json",
             f"description: {q(f'{name}, from {source.name} (written by doit new)')}",
             "source:", f"  path: {q(source.name)}", f"  sha256: {sha256}"]
    if licenses:
        lines.append(f"license: [{', '.join(q(l) for l in licenses)}]")
    lines.append("inputs:")
    for in_name, shape in shapes.items():
        lines += [f"  {q(in_name)}:", f"    shape: {json.dumps(shape)}", f"    dtype: {dtypes[in_name]}"]
        if in_name in (values or {}):  # bound to one value (value=): a constant, not test data
            lines.append(f"    value: {values[in_name]!r}")
            continue
        data = test_data(dtypes[in_name])
        lines += ["    test_data:",
                  "      random: {" + ", ".join(f"{k}: {v}" for k, v in data.items()) + "}"]
    why = (f" (outputs reach {scale:.3g} on the test inputs)" if scale is not None else "")
    lines += [f"tolerance:                 # what every artifact must match golden within{why}"]
    lines += [f"  {k}: {v}" for k, v in (tolerance or TOLERANCE).items()]
    return "\n".join(lines) + "\n"


def no_license(name: str, folder: Path) -> str:
    """The warning of a model written without a licence: a release ships each model's licence
    files, and whoever ships it must know under which terms."""
    return (f"warning: [model={name} stage=new] no licence given: {folder}/model.yaml lists "
            f"none, so no release can say under which terms {name} may be shipped\n"
            f"  next: copy its licence file into {folder}/ and add `license: FILE` to model.yaml "
            f"(or run doit new again with license=PATH)")


def new_model(source: str | None, name: str | None, shapes: list[str], license: str | None,
              models_dir: Path, memo_dir: Path | None = None, values: list[str] | None = None) -> str:
    """Write models_dir/name from `source`; returns what was written and what to run next."""
    if not source or not name:
        raise PipelineError("say source=PATH (an .onnx or .tflite file, or an NNEF folder) and "
                            "name=NAME", stage="new",
                            hint="doit new source=model.onnx name=my_model [shape=x:1x3x224x224]")
    src, models_dir = Path(source).expanduser().resolve(), Path(models_dir).resolve()
    if not NAME_RE.match(name):
        raise PipelineError(f"name={name}: a model name must match {NAME_RE.pattern}", stage="new",
                            hint="lower case letters, digits, '-' and '_'")
    folder = models_dir / name
    if folder.exists():
        raise PipelineError(f"{folder} already exists: doit new never overwrites a model",
                            stage="new", model=name, hint="choose another name=, or edit its model.yaml")
    fmt = source_format(src) if src.exists() else None
    if fmt is None:
        raise PipelineError(f"source={source}: {'not found' if not src.exists() else 'not an .onnx or .tflite file or an NNEF folder'}",
                            stage="new", model=name)
    lic = Path(license).expanduser().resolve() if license else None
    if lic is not None and not lic.is_file():
        raise PipelineError(f"license={license}: file not found", stage="new", model=name)
    signature = read_signature(src)
    if "error" in signature:
        raise PipelineError(f"{src.name} is not a readable {fmt} model: {signature['error']}",
                            stage="new", model=name)
    inputs = signature["inputs"]
    bad = [f"{i['name']!r} ({i['dtype']})" for i in inputs if i["dtype"] not in DTYPES]
    if bad:
        raise PipelineError(f"{src.name}: input dtype(s) the pipeline cannot feed: {', '.join(bad)}",
                            stage="new", model=name, hint=f"dtypes: {', '.join(DTYPES)}")
    shapes, problems = bind(inputs, parse_shapes(shapes))
    bound_values, wrong = parse_values(values or [], inputs)
    if wrong:
        raise PipelineError(f"{src.name}: cannot bind the values given, nothing was written:\n"
                            + "\n".join(f"  - {p}" for p in wrong), stage="new", model=name,
                            hint=VALUE_HINT)
    if problems:
        raise PipelineError(f"{src.name}: cannot bind every input dim, nothing was written:\n"
                            + "\n".join(f"  - {p}" for p in problems), stage="new", model=name,
                            hint=HINT)
    # staged as models/.new/NAME (the loader skips dot folders; the folder name is the model's)
    staging = models_dir / ".new" / name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if fmt == "nnef":
            shutil.copytree(src, staging / src.name)
        else:
            for path in source_files(src).values():
                dest = staging / path.relative_to(src.parent)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
        licenses = []
        if lic is not None:
            shutil.copyfile(lic, staging / lic.name)
            licenses.append(lic.name)
        sha = source_sha256(staging / src.name)
        dtypes = {i["name"]: i["dtype"] for i in inputs}
        (staging / "model.yaml").write_text(spec_text(name, src, sha, shapes, dtypes, licenses,
                                                      values=bound_values))
        specs, found = load_model(staging / "model.yaml", memo_dir)
        if not found and fmt != "nnef":  # scale the tolerance to what the model outputs
            scale = output_scale(staging / src.name, fmt, specs[0])
            (staging / "model.yaml").write_text(
                spec_text(name, src, sha, shapes, dtypes, licenses, tolerance_for(scale), scale,
                          values=bound_values))
            _, found = load_model(staging / "model.yaml", memo_dir)
        if found:
            raise PipelineError("the spec written does not load (a bug of doit new):\n"
                                + "\n".join(f"  - {p}" for p in found), stage="new", model=name)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.parent.rmdir()
        except OSError:  # another `doit new` stages there too
            pass
    if lic is None:
        print(f"modelyard: {no_license(name, folder)}", file=sys.stderr)
    bound = "; ".join(f"{n} {dtype} {_text(s)}" + (f" = {bound_values[n]!r}" if n in bound_values else "")
                      for (n, s), dtype in zip(shapes.items(), [i["dtype"] for i in inputs]))
    return (f"wrote {folder}/model.yaml (inputs: {bound}; sha256 {sha[:12]}...)\n"
            f"next: doit build target=host (or rk3588); `doit coverage target=host` says which "
            f"stage or compiler stopped it, if one did")

