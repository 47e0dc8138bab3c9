"""What the runtimes' profilers of `doit profile` share (pipeline/bench/profile.py): the options
of one run, the Context of one model, and tensor fingerprints (how a kernel's values are matched
to onnxruntime's). A module of its own so that profile.py and each runtime's profiler import it,
not each other."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import PipelineError
from ..core.layout import Layout
from ..run.ort import reduced_session
from .profile_graph import FLOAT_TYPES, Graph
from .profile_sides import STAGE


# ----------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """What one `doit profile` run is asked to do (doit vars of the same names)."""
    abi: str | None = None       # one ABI of the model (default: every one that runs here)
    iterations: int = 10         # runs per runtime per round
    rounds: int = 3              # the runtimes take turns this many times
    warmup: int = 2              # untimed runs of each runtime first
    threads: int | None = None   # CPU threads, all runtimes (default: every usable CPU, as the bench)

    def __post_init__(self):
        bad = [f"{k}={getattr(self, k)}: must be >= {low}" for k, low in
               (("iterations", 1), ("rounds", 1), ("warmup", 0)) if getattr(self, k) < low]
        if self.threads is not None and self.threads < 1:
            bad.append(f"threads={self.threads}: must be >= 1")
        if bad:
            raise PipelineError("bad profile options: " + "; ".join(bad), stage=STAGE,
                                hint="e.g. doit profile target=host model=ppocr_cls iterations=10 "
                                     "rounds=3")

    @classmethod
    def from_vars(cls, raw: dict) -> "Options":
        kw = {}
        for name, value in raw.items():
            if value is None:
                continue
            try:
                kw[name] = value if name == "abi" else int(value)
            except ValueError:
                raise PipelineError(f"profile option {name}={value!r} is not valid", stage=STAGE,
                                    hint="iterations, rounds, warmup and threads take integers"
                                    ) from None
        return cls(**kw)

    def usable_threads(self) -> int:
        return self.threads or len(os.sched_getaffinity(0))


# ----------------------------------------------------------------------------- together


@dataclass
class Context:
    """What every runtime's profiler of one model shares."""
    layout: Layout
    target: str
    model: str
    options: Options
    scratch: Path
    named_model: Path
    graph: Graph
    input_names: list[str]
    inputs: list
    input_files: list[Path]
    threads: int
    log: Path
    _reference: dict | None = None

    def where(self, abi: str | None = None) -> dict:
        return {"stage": STAGE, "model": self.model,
                "target": f"{self.target}/{abi}" if abi else self.target}

    def reference(self) -> dict:
        """onnxruntime's value of every float tensor of the static model on the golden inputs,
        as fingerprints: tensor -> (shape, sum, sum of |x|)."""
        if self._reference is None:
            import onnx  # onnx: 1.5 s, not needed by doit list
            from onnx import helper  # onnx: 1.5 s, not needed by doit list
            model = onnx.load(str(self.named_model))
            present = {o.name for o in model.graph.output}
            for n in self.graph.nodes:
                for t in n.outputs:
                    if t not in present and self.graph.types.get(t) in FLOAT_TYPES:
                        model.graph.output.append(helper.make_tensor_value_info(
                            t, self.graph.types[t], None))
            names = [o.name for o in model.graph.output]
            values = reduced_session(model.SerializeToString()).run(
                None, dict(zip(self.input_names, self.inputs)))
            values = [*values, *self.inputs]
            names = [*names, *self.input_names]
            self._reference = {n: fingerprint(v) for n, v in zip(names, values)
                               if getattr(v, "dtype", None) is not None and v.dtype.kind == "f"}
        return self._reference


def fingerprint(array) -> tuple:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    a = np.asarray(array, dtype=np.float64)
    return tuple(a.shape), float(a.sum()), float(np.abs(a).sum())


def same_values(a: tuple, b: tuple, rel: float = 1e-3) -> bool:
    """Two fingerprints (shape, sum, sum of |x|) of the same tensor computed two ways."""
    if a[0] != b[0] and math.prod(a[0]) != math.prod(b[0]):
        return False
    scale = max(abs(a[2]), abs(b[2]), 1e-12) * rel + 1e-9
    return abs(a[1] - b[1]) <= scale and abs(a[2] - b[2]) <= scale
