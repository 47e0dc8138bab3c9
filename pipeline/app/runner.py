"""A small runtime helper for apps and tests: pick the artifact the present device can run, run it.

    from pipeline.app import Runner
    runner = Runner.open("artifacts/rk3588/manifest.json", "ppocr_det")   # or prefer=/vulkan_driver=
    runner = Runner.open("artifacts/rk3588/manifest.json", "ppocr_cls", variant="int8")
                                       # a precision variant (the manifest's "ppocr_cls.int8")
    print(runner.choice.explain())     # which artifact, and why each one before it was passed over
    (probs,) = runner.run(image)       # numpy in, numpy out; the module is loaded once

The target's fallback order (manifest `target.fallback`) is walked in order; the first artifact
this machine can run is loaded. Whether it can, on which device, and how it loads, each
artifact's backend answers (`backend_for(art).app`, pipeline/run/loader.py's interface):
  * IREE (run/iree_load.py): Vulkan artifacts need a Vulkan device that meets the artifact's
    recorded requirements (API/SPIR-V version, features, subgroup size); the loader's first
    device is used, but a software rasterizer (lavapipe) is never picked on its own:
    `vulkan_driver="lavapipe"` pins the Mesa software driver (headless CI, tests).
  * CPU artifacts (IREE, TVM: run/tvm_load.py): native when built for this machine's
    architecture; an aarch64 artifact on an x86_64 machine runs under qemu-user when
    `allow_emulation` (slow, for checks only).
  * NPU artifacts (RKNN `.rknn`, run/rknn_load.py) load only where the machine has a Rockchip
    NPU and rknn-toolkit-lite2 (librknnrt): elsewhere, such as on this build host, they are
    passed over with that reason and the next ABI is tried.
`prefer="abi-name"` overrides the order: that artifact or a clear error, never a silent switch.
Where the manifest's `choice` says another compiler's artifact ships for the same device (a
slot), the others are passed over ("not the shipped choice"), unless named by `prefer`.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..compilers.backends import BY_FORMAT
from ..core.errors import PipelineError
from ..core.layout import Layout
from ..core.store import sha256_file
from ..run.loader import STAGE, Choice, Context


class Runner:
    def __init__(self, choice: Choice, module, entry: str, declared: list | None = None):
        self.choice, self.entry = choice, entry
        self._module = module             # numpy arrays in, a list of numpy arrays out
        self._declared = declared or []   # the outputs' dtypes in the manifest's io

    # -------------------------------------------------------------------------- choosing
    @classmethod
    def open(cls, manifest: str | Path, model: str, *, variant: str | None = None,
             prefer: str | None = None, vulkan_driver: str | None = None,
             allow_emulation: bool = True, base: str | Path | None = None) -> "Runner":
        manifest = Path(manifest)
        doc = json.loads(manifest.read_text())
        layout = Layout(Path(base)) if base else Layout.of_manifest(manifest)
        target = doc["target"]["name"]
        if variant not in (None, "fp32"):  # a precision variant: its own manifest entry
            model = f"{model}.{variant}"
        where = {"model": model, "target": target}
        if model not in doc["models"]:
            raise PipelineError(f"no model {model!r} in {manifest} (it has: "
                                f"{', '.join(doc['models'])})", stage=STAGE, **where,
                                hint="a precision variant is listed only when it passed its "
                                     "accuracy gate; see `doit accuracy`")
        entry_doc = doc["models"][model]
        artifacts = entry_doc["artifacts"]
        order = [a for a in doc["target"].get("fallback", list(artifacts)) if a in artifacts]
        not_shipped = {abi: f"not the shipped choice ({slot['ships']} ships: {slot['reason']})"
                       for slot in entry_doc.get("choice", {}).values()
                       for abi in slot["candidates"] if abi != slot["ships"]}
        if prefer is not None:
            if prefer not in artifacts:
                raise PipelineError(f"no artifact {prefer!r} for {model} (it has: "
                                    f"{', '.join(order)})", stage=STAGE, **where)
            order = [prefer]
        ctx = Context(vulkan_driver=vulkan_driver, allow_emulation=allow_emulation)
        considered = []
        if prefer is None:
            considered += [(abi, f"not built for this model: {why}")
                           for abi, why in sorted(entry_doc.get("skipped", {}).items())]
        for abi in order:
            art = artifacts[abi]
            backend = BY_FORMAT.get(art.get("format"))
            why = None if prefer else not_shipped.get(abi)
            if backend is None:  # a manifest of a modelyard with a backend this one lacks
                why = (f"its format {art.get('format')!r} is not one this modelyard loads "
                       f"({', '.join(BY_FORMAT)})")
            loader = backend.app if backend else None
            why = why or loader.why_not(art, ctx)
            if why is None:
                choice = loader.choice(abi, art, layout.resolve(art["path"]), ctx, considered)
                here = {**where, "target": f"{target}/{abi}"}
                cls._check(choice, art, here)
                outputs = entry_doc["io"]["outputs"]
                module = loader.load(choice, art, len(outputs), ctx, here)
                return cls(choice, module, art["entry"], [o.get("dtype") for o in outputs])
            considered.append((abi, why))
        reasons = "; ".join(f"{abi}: {why}" for abi, why in considered)
        raise PipelineError(f"no artifact of {model} can run on this machine ({reasons})",
                            stage=STAGE, hint="build for this machine's target, or install the "
                            "missing driver", **where)

    @staticmethod
    def _check(choice: Choice, art: dict, where: dict) -> None:
        """The chosen file is there, and is the file the manifest names."""
        if not choice.path.is_file():
            raise PipelineError(f"artifact file missing: {choice.path}", stage=STAGE, **where)
        if sha256_file(choice.path) != art["sha256"]:
            raise PipelineError(f"{choice.path} does not match its manifest sha256",
                                stage=STAGE, hint="rebuild, or restore the released file", **where)

    # -------------------------------------------------------------------------- running
    def run(self, *inputs) -> list:
        """Run on numpy arrays; returns a list of numpy arrays (one per model output)."""
        return self._as_declared(list(self._module(*inputs)))

    def _as_declared(self, outputs: list) -> list:
        """IREE's integers are signless: a uint8 output comes back as int8 with the same bytes.
        Read such an output as the dtype the manifest declares (as validation did)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        fixed = []
        for k, out in enumerate(outputs):
            want = np.dtype(self._declared[k]) if k < len(self._declared) and self._declared[k] else None
            if want is not None and out.dtype != want and out.dtype.kind in "iu" and \
                    want.kind in "iu" and out.dtype.itemsize == want.itemsize:
                out = out.view(want)
            fixed.append(out)
        return fixed
