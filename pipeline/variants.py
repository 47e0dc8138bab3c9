"""Shape variants: a few fixed input shapes of one model, each built and validated on its own.

    inputs:   {x: {shape: [1, 3, 48, 192], ...}}      # the model itself, under its own name
    variants:                                        # more fixed shapes of the same source
      48x320: {inputs: {x: {shape: [1, 3, 48, 320]}}}

Each variant becomes a ModelSpec named `<model>.<variant>` (e.g. `ppocr_cls.48x320`) at
spec-load time, with the model's dtypes, test data, tolerance, skips and release section and its
own shapes; it has its own golden, static model, artifacts and validation, and shares the
model's source and import step. The model keeps its plain name (apps, releases and tests that
know `ppocr_cls` keep working); the manifest marks the variants with `variant_of` and `variant`,
so an app picks the entry whose input shapes match its camera mode. Dynamic dims never reach a
compiler: every variant binds every dim.
"""
from __future__ import annotations

import dataclasses
import re

VARIANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
SEP = "."  # not "@": iree-run-module cannot load a --module= path holding "@"


def parse(raw, raw_inputs: dict, where: str, problems: list) -> dict:
    """{variant name: {input name: shape}} from the `variants:` section; problems appended."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        problems.append(f"{where}: variants: expected a mapping of variant name -> "
                        f"{{inputs: {{NAME: {{shape: [...]}}}}}}")
        return {}
    out = {}
    for name, body in raw.items():
        vw = f"{where}: variants.{name}"
        if not isinstance(name, str) or not VARIANT_RE.match(name):
            problems.append(f"{vw}: a variant name must match {VARIANT_RE.pattern} (e.g. 480x640)")
            continue
        if not isinstance(body, dict) or set(body) != {"inputs"} or not isinstance(body["inputs"], dict):
            problems.append(f"{vw}: expected exactly {{inputs: {{NAME: {{shape: [...]}}}}}}")
            continue
        shapes = {}
        for in_name, ib in body["inputs"].items():
            iw = f"{vw}.inputs.{in_name}"
            if in_name not in raw_inputs:
                problems.append(f"{iw}: not an input of the model spec (inputs: {', '.join(raw_inputs)})")
            elif not isinstance(ib, dict) or set(ib) != {"shape"}:
                problems.append(f"{iw}: a variant sets the shape only: expected {{shape: [...]}}")
            elif not isinstance(ib["shape"], list) or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in ib["shape"]):
                problems.append(f"{iw}.shape: expected a list of positive integers (a variant binds "
                                f"every dim), got {ib['shape']!r}")
            else:
                shapes[in_name] = tuple(ib["shape"])
        out[name] = shapes
    return out


def bind(inputs, shapes: dict) -> dict:
    """{variant name: the model's InputSpecs with the variant's shapes}."""
    return {v: tuple(dataclasses.replace(i, shape=bound.get(i.name, i.shape)) for i in inputs)
            for v, bound in shapes.items()}


def check(signature: dict, raw_inputs: dict, inputs, shapes: dict, where: str, problems: list,
          check_against_model) -> None:
    """Each variant's shapes against the model (rank, fixed dims): spec._check_against_model."""
    if signature and "inputs" in signature:
        for vname, bound in bind(inputs, shapes).items():
            check_against_model(signature, raw_inputs, list(bound), f"{where}: variants.{vname}", problems)


def expand(spec, shapes: dict) -> list:
    """[spec, spec.v1, spec.v2, ...]: one ModelSpec per variant, after the spec is checked."""
    out = []
    for vname, inputs in bind(spec.inputs, shapes).items():
        shown = ", ".join(f"{i.name} {list(i.shape)}" for i in inputs)
        out.append(dataclasses.replace(spec, name=f"{spec.name}{SEP}{vname}", inputs=inputs,
                                       variant_of=spec.name, variant=vname, variants=(),
                                       description=f"{spec.description} [variant {vname}: {shown}]"))
    return [dataclasses.replace(spec, variants=tuple(v.name for v in out)), *out]
