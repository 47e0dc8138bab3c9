"""Shape variants: a few fixed input shapes of one model, each built and validated on its own.

    inputs:   {x: {shape: [1, 3, 48, 192], ...}}      # the model itself, under its own name
    shapes:                                          # more fixed shapes of the same source
      48x320: {inputs: {x: {shape: [1, 3, 48, 320]}}}

Each shape becomes a ModelSpec named `<model>.<shape>` (e.g. `ppocr_cls.48x320`) at spec-load
time, with the model's dtypes, test data, tolerance, skips and release section and its own
shapes; it has its own golden, static model, artifacts and validation, and shares the model's
source and import step. The model keeps its plain name (apps, releases and tests that know
`ppocr_cls` keep working); the manifest marks the shape variants with `shape_of` and `shape`, so
an app picks the entry whose input shapes match its camera mode. Dynamic dims never reach a
compiler: every shape binds every dim.

Precision variants (`variants:`, pipeline/spec/variants.py: `<model>.int8`, ...) are made from the
model's own shape only: a shape variant is fp32 (its calibration and evaluation data would have
to fit its shape, which the spec does not declare). Likewise a model's TVM tuning budget and
pinned database (`tvm:`) are for its own shape: a shape variant's TVM artifacts are untuned;
and its explicit compiler choices (`ship:`): a shape variant's choice follows its own figures
(the target's policy, or what `doit search` pinned for it, docs/configs.md).
"""
from __future__ import annotations

import dataclasses
from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from .common import CLOSED, NAME_RE, Doc, Says

SEP = "."  # not "@": iree-run-module cannot load a --module= path holding "@"


def _dims(value):
    if not isinstance(value, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value):
        raise PydanticCustomError("shape", "expected a list of positive integers (a shape binds "
                                  "every dim), got {shape}", {"shape": repr(value)})
    return value


class ShapeInputDoc(Doc):
    """A shape variant sets the shape only: dtype and test data are the model's."""
    shape: Annotated[list[Annotated[int, Field(gt=0)]], BeforeValidator(_dims)]


class ShapeDoc(Doc):
    """One more fixed shape of the model: built and validated as `<model>.<shape>`."""
    inputs: dict[str, ShapeInputDoc]
    """the inputs whose shape differs from the model's"""


Shapes = Annotated[dict[Annotated[str, Field(pattern=NAME_RE.pattern), Says(
    f"a shape name must match {NAME_RE.pattern} (e.g. 480x640)")], ShapeDoc],
                   Field(min_length=1, json_schema_extra=CLOSED)]


def parse(doc: dict | None, declared: list[str], where: str, problems: list) -> dict:
    """{shape name: {input name: shape}} from the `shapes:` section; problems appended."""
    out = {}
    for name, body in (doc or {}).items():
        if body is None:
            continue
        shapes = {}
        for in_name, ib in (body.inputs or {}).items():
            if in_name not in declared:
                problems.append(f"{where}: shapes.{name}.inputs.{in_name}: not an input of the "
                                f"model spec (inputs: {', '.join(declared)})")
            elif ib is not None and ib.shape is not None:
                shapes[in_name] = tuple(ib.shape)
        out[name] = shapes
    return out


def bind(inputs, shapes: dict) -> dict:
    """{shape name: the model's InputSpecs with that shape}."""
    return {v: tuple(dataclasses.replace(i, shape=bound.get(i.name, i.shape)) for i in inputs)
            for v, bound in shapes.items()}


def check(signature: dict, declared: list[str], inputs, shapes: dict, where: str, problems: list,
          check_against_model) -> None:
    """Each shape against the model (rank, fixed dims): spec._check_against_model."""
    if signature and "inputs" in signature:
        for vname, bound in bind(inputs, shapes).items():
            check_against_model(signature, declared, list(bound), f"{where}: shapes.{vname}", problems)


def expand(spec, shapes: dict) -> list:
    """[spec, spec.s1, spec.s2, ...]: one ModelSpec per shape, after the spec is checked."""
    out = []
    for vname, inputs in bind(spec.inputs, shapes).items():
        shown = ", ".join(f"{i.name} {list(i.shape)}" for i in inputs)
        out.append(dataclasses.replace(spec, name=f"{spec.name}{SEP}{vname}", inputs=inputs,
                                       shape_of=spec.name, shape=vname, shapes=(),
                                       variants=(),  # precision variants: the model's own shape only
                                       tvm={},  # a TVM budget and database are for the model's shape
                                       ship={},  # so is an explicit choice: a variant's follows its figures
                                       description=f"{spec.description} [shape {vname}: {shown}]"))
    return [dataclasses.replace(spec, shapes=tuple(v.name for v in out)), *out]
