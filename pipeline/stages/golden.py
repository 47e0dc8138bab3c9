"""Stage `golden`: onnxruntime CPU outputs of the source model on the model's fixed test inputs.

A model whose integer products onnxruntime computes with kernels that depend on the CPU (dynamic
int8: MatMulInteger, DynamicQuantizeLSTM, ...; AVX2 saturates where VNNI does not) gets its golden
from the source with those products computed exactly (rewrite/contrib_ops.py
exact_integer_reference): the same on any CPU, and what the compiled artifacts compute. golden.json
then says so (`reference`: what ran, why, what was rewritten, what was left to onnxruntime).

golden.json's `noise` is how far the reference's outputs move when it is run again with other
roundings (LiteRT's XNNPACK and reference kernels; onnxruntime without graph optimisations and
with its transcendental outputs and quantizer inputs one ulp off: run/reference_noise.py): the
static and validate stages hold each float output to max(declared, k x noise), so that a model
whose outputs amplify rounding (a dynamically quantized LSTM, an ill-conditioned logit map) is
not failed on every compiler for differences its own reference has.

Writes input_<i>.npy and output_<k>.npy (plain .npy: byte-deterministic, and what
iree-run-module reads) plus golden.json naming them. Every later stage compares against these.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..core.layout import outputs_for, static_model
from ..core.numerics import make_input
from ..core.steps import StageConfig, Step, key_value
from ..core.store import pretty_json
from ..rewrite import tflite_rewrite, tflite_state
from ..rewrite.contrib_ops import exact_reference
from ..rewrite.postprocess import cut_file
from ..rewrite.recurrent import sequence_first
from ..rewrite.sources import tflite_run
from ..run import reference_noise
from ..run.ort import reduced_session, session, variant_feeds
from ..spec.calibration import Preprocessing, SampleError, load_sample
from ..spec.sources import GOLDEN, source_files
from ..spec.variants import (IO_DTYPES, full_name, variant_inputs, variant_preprocessing,
                             variant_tools)
from ..spec.samples import Samples, sample_inputs_problems

# 2: golden.json's `noise` (run/reference_noise.py)
VERSION = 2


@dataclass(frozen=True)
class Config(StageConfig):
    inputs: tuple[dict, ...]        # per input: name, shape, dtype, test_data (numerics.make_input)
    n_outputs: int                  # the outputs the model's graph declares
    reference: str | None = None    # a TFLite/NNEF source: what runs it (spec.sources.GOLDEN)
    outputs: tuple[str, ...] | None = None  # ... and its output names, in order
    cut: tuple[str, ...] = ()       # a cut detector (spec postprocess): the tensors it returns

    def problems(self):
        if not self.inputs or any(set(i) != {"name", "shape", "dtype", "test_data"} for i in self.inputs):
            yield "inputs must list each input as {name, shape, dtype, test_data}"
        if not isinstance(self.n_outputs, int) or self.n_outputs < 1:
            yield f"n_outputs must be a positive integer, got {self.n_outputs!r}"
        if (self.reference is None) != (self.outputs is None):
            yield "reference and outputs go together: a TFLite/NNEF source names both"
        elif self.reference is not None and self.reference not in GOLDEN.values():
            yield f"reference must be one of {', '.join(GOLDEN.values())}, got {self.reference!r}"
        elif self.outputs is not None and len(self.outputs) != self.n_outputs:
            yield f"outputs names {len(self.outputs)} outputs, n_outputs says {self.n_outputs}"

    def as_key(self) -> dict:
        key = {"inputs": key_value(self.inputs), "n_outputs": self.n_outputs}
        if self.reference is not None:  # ONNX sources' keys unchanged
            key.update(reference=self.reference, outputs=list(self.outputs))
        if self.cut:  # the source run up to the cut tensors (rewrite/postprocess.py)
            key["cut"] = list(self.cut)
        return key


@dataclass(frozen=True)
class VariantConfig(StageConfig):
    """A precision variant's golden files, on the evaluation sample farthest from fp32."""
    inputs: tuple[dict, ...]        # per input: name, shape, dtype
    preprocessing: dict             # input name -> spec.calibration.Preprocessing as a dict
    io_dtype: str                   # what the variant's inputs/outputs are: float32 | float16
    evaluation: Samples             # the evaluation set the sample is taken from
    n_outputs: int

    def problems(self):
        yield from sample_inputs_problems(self.inputs, self.preprocessing)
        if self.io_dtype not in IO_DTYPES:
            yield f"io_dtype must be one of {', '.join(IO_DTYPES)}, got {self.io_dtype!r}"
        if not isinstance(self.n_outputs, int) or self.n_outputs < 1:
            yield f"n_outputs must be a positive integer, got {self.n_outputs!r}"

    @classmethod
    def from_key(cls, key: dict) -> "VariantConfig":
        return cls(**{**key, "evaluation": Samples.from_key(key["evaluation"])})


def run(ctx) -> None:
    import numpy as np  # numpy: 0.2 s, not needed by doit list

    cfg = ctx.cfg
    specs = cfg.inputs
    arrays = []
    for spec in specs:
        file = ctx.input(f"test_data:{spec['name']}") if "file" in spec["test_data"] else None
        try:
            arrays.append(make_input(spec, file))
        except ValueError as exc:
            raise ctx.error(f"test data for input {spec['name']!r}: {exc}",
                            hint="regenerate the .npy with the shape and dtype of the spec")
    reference, exact = cfg.reference or GOLDEN["onnx"], None
    try:
        if reference == "litert (source)":  # a TFLite source: its own interpreter is the reference
            got = tflite_run(ctx.input("source"), {s["name"]: a for s, a in zip(specs, arrays)})
            names = cfg.outputs
            results = [got[n] for n in names]
        else:
            tmp = tempfile.TemporaryDirectory()  # a cut detector's graph up to the cut tensors
            source = cut_file(ctx.input("source"), cfg.cut, tmp.name) if cfg.cut else ctx.input("source")
            exact = exact_reference(source, {s["name"]: a.shape for s, a in zip(specs, arrays)})
            ran = exact[0] if exact else source
            try:
                sess = session(ran)
            except Exception as exc:  # onnxruntime runs no batch-first LSTM/GRU: the same op
                if "layout == 1" not in str(exc):  # in layout 0 between Transposes, by the spec
                    raise
                ran = sequence_first(source, tmp.name)
                sess = session(ran)
            names = [o.name for o in sess.get_outputs()]
            results = sess.run(None, {s["name"]: a for s, a in zip(specs, arrays)})
    except Exception as exc:
        raise ctx.error(f"{reference.split()[0]} cannot run the source model on the test inputs "
                        f"{[list(a.shape) for a in arrays]}: {str(exc).strip().splitlines()[-1]}",
                        hint="check the input shapes and dtypes in the spec (or the variant's); "
                             "the model may not accept these shapes")
    doc = {"inputs": [], "outputs": []}
    if exact:  # recorded in the manifest (golden.json's reference)
        doc["reference"] = {"what": "onnxruntime on the source, its integer products computed exactly",
                            **exact[1]}
    feeds = {s["name"]: a for s, a in zip(specs, arrays)}
    try:  # the reference rerun with other roundings (run/reference_noise.py)
        doc["noise"] = (reference_noise.measure_tflite(_litert_data(ctx.input("source")), feeds,
                                                       results, list(names))
                        if reference == "litert (source)" else
                        reference_noise.measure_onnx(ran, feeds, results, list(names)))
    except Exception as exc:  # noqa: BLE001 - recorded: the declared tolerance applies as it is
        doc["noise"] = {"not_measured": f"{type(exc).__name__}: "
                                        f"{(str(exc).strip().splitlines() or [''])[0][:300]}"}
    if exact:
        exact[0].unlink()
    for i, (spec, array) in enumerate(zip(specs, arrays)):
        np.save(ctx.output(f"input_{i}.npy"), array, allow_pickle=False)
        doc["inputs"].append({"name": spec["name"], "file": f"input_{i}.npy",
                              "shape": list(array.shape), "dtype": str(array.dtype)})
    if len(results) != cfg.n_outputs:
        raise ctx.error(f"the model returned {len(results)} outputs, its graph declares "
                        f"{cfg.n_outputs}")
    for k, (name, array) in enumerate(zip(names, results)):
        np.save(ctx.output(f"output_{k}.npy"), array, allow_pickle=False)
        doc["outputs"].append({"name": name, "file": f"output_{k}.npy",
                               "shape": list(array.shape), "dtype": str(array.dtype)})
    ctx.output("golden.json").write_text(pretty_json(doc))


def _litert_data(path):
    """The flatbuffer tflite_run gives LiteRT: resource variables as explicit state, the custom
    ops tflite_rewrite knows as builtins."""
    data = path.read_bytes()
    if tflite_state.stateful(data):
        data = tflite_state.explicit_state(data)[0]
    return tflite_rewrite.rewrite(data, only_custom=True)[0]


def variant_outputs_for(n_inputs: int, n_outputs: int) -> tuple[str, ...]:
    return outputs_for(n_inputs, n_outputs) + tuple(f"reference_{k}.npy" for k in range(n_outputs))


def run_variant(ctx) -> None:
    """The golden files of a precision variant (see pipeline/spec/variants.py), on the evaluation
    sample where the variant is farthest from fp32 (the gate's worst cosine, first output), so
    that validating against fp32 within the gate is checked where it is tightest: the sample as
    input_<i>.npy, the variant's onnxruntime outputs (graph optimisations off: the QDQ/fp16 graph
    as written, what IREE compiles) as output_<k>.npy, fp32's as reference_<k>.npy."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list

    cfg = ctx.cfg
    pre = {k: Preprocessing.from_dict(v) for k, v in cfg.preprocessing.items()}
    chosen = json.loads(ctx.input("accuracy.json").read_text())["outputs"][0]["worst_sample"]
    try:
        sample = load_sample(ctx.input(f"evaluation:{chosen}"), cfg.evaluation.kind,
                             list(cfg.inputs), pre)
    except SampleError as exc:
        raise ctx.error(f"evaluation sample {exc}", hint="fix or remove that file")
    reference = session(ctx.input("fp32")).run(None, sample)
    feeds = variant_feeds(sample, cfg.io_dtype)
    sess = reduced_session(ctx.input("model"))
    names = [o.name for o in sess.get_outputs()]
    results = sess.run(None, feeds)
    if len(results) != cfg.n_outputs:
        raise ctx.error(f"the variant returned {len(results)} outputs, fp32 has {cfg.n_outputs}")
    doc = {"inputs": [], "outputs": [], "reference": [], "sample": chosen,
           "why": "the evaluation sample where the variant differs most from fp32 (worst cosine)"}
    for i, spec in enumerate(cfg.inputs):
        array = feeds[spec["name"]]
        np.save(ctx.output(f"input_{i}.npy"), array, allow_pickle=False)
        doc["inputs"].append({"name": spec["name"], "file": f"input_{i}.npy",
                              "shape": list(array.shape), "dtype": str(array.dtype)})
    for k, (name, array, ref) in enumerate(zip(names, results, reference)):
        np.save(ctx.output(f"output_{k}.npy"), array, allow_pickle=False)
        np.save(ctx.output(f"reference_{k}.npy"), ref, allow_pickle=False)
        doc["outputs"].append({"name": name, "file": f"output_{k}.npy",
                               "shape": list(array.shape), "dtype": str(array.dtype)})
        doc["reference"].append({"name": name, "file": f"reference_{k}.npy",
                                 "shape": list(ref.shape), "dtype": str(ref.dtype)})
    ctx.output("golden.json").write_text(pretty_json(doc))


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """Each model's golden outputs, then its precision variants' (their own reference)."""
    out = []
    for model in project.models:
        out.append(golden_step(project.layout, model))
        out += [variant_step(project.layout, model, v) for v in model.variants]
    return out


def golden_step(layout, model) -> Step:
    # the reference: the source itself (onnxruntime, or LiteRT for TFLite); for NNEF, which has no
    # interpreter here, onnxruntime on its conversion
    fmt = model.source_format
    # an ONNX source's external-data files are inputs too: onnxruntime reads them beside it
    inputs = ({"source": layout.model_stage(model.base, "import") / "model.onnx"} if fmt == "nnef"
              else {"source": model.source} if fmt != "onnx"
              else source_files(model.source, model.external_data))
    for spec in model.inputs:
        if spec.test_data.kind == "file":
            inputs[f"test_data:{spec.name}"] = spec.test_data.file
    n_out = len(model.signature["outputs"])
    reference = {} if fmt == "onnx" else {
        "reference": GOLDEN[fmt], "outputs": tuple(o["name"] for o in model.signature["outputs"])}
    return Step(stage="golden", name=model.name, version=VERSION,
                config=Config(inputs=tuple(i.as_dict() for i in model.inputs), n_outputs=n_out,
                              cut=tuple(model.postprocess.get("cut", ())), **reference),
                inputs=inputs, outputs=outputs_for(len(model.inputs), n_out),
                out_dir=layout.model_stage(model.name, "golden"),
                tools=("onnxruntime", "numpy") + (("ai-edge-litert",) if fmt == "tflite" else ()),
                action=run, layout=layout,
                doc=f"{GOLDEN[fmt]} outputs on the fixed test inputs",
                where={"model": model.name}, after=(f"import:{model.base}",))


def variant_step(layout, model, v) -> Step:
    name = full_name(model, v)
    n_out = len(model.signature["outputs"])
    return Step(
        stage="golden", name=name, version=VERSION,
        config=VariantConfig(inputs=variant_inputs(model), preprocessing=variant_preprocessing(model),
                             io_dtype=v.io_dtype, evaluation=Samples.from_key(v.evaluation.as_dict()),
                             n_outputs=n_out),
        inputs={"fp32": static_model(layout, model),
                "model": layout.model_stage(name, "quantize") / "model.onnx",
                "accuracy.json": layout.model_stage(name, "accuracy") / "accuracy.json",
                **{f"evaluation:{p.name}": p for p in v.evaluation.files}},
        outputs=variant_outputs_for(len(model.inputs), n_out),
        out_dir=layout.model_stage(name, "golden"), tools=variant_tools(v),
        action=run_variant, layout=layout, where={"model": name},
        doc=f"onnxruntime outputs of the {v.precision} model and of fp32 on the "
            f"evaluation sample where they differ most")
