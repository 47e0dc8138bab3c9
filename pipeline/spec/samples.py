"""A data set of a precision variant (calibration, evaluation) as a step holds it: `Samples` in its
config (the files are its inputs), the rules its inputs and preprocessing follow, and the samples
read back as model inputs. Shared by the variant stages (quantize, golden, accuracy,
rknn_compile): a stage that needs it imports it here, not from a sibling stage (whose edits would
then re-run it: core/codehash.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.steps import StageConfig
from ..core.store import canonical_json, sha256_file, sha256_text
from .calibration import Preprocessing, SampleError, load_sample

SAMPLE_KINDS = ("image", "npy", "npz")


@dataclass(frozen=True)
class Samples(StageConfig):
    """A data set (calibration, evaluation) as step configs hold it: the files are step inputs."""
    kind: str                       # image | npy | npz
    files: tuple[str, ...]          # the samples' file names, in order

    def problems(self):
        if self.kind not in SAMPLE_KINDS:
            yield f"kind must be one of {', '.join(SAMPLE_KINDS)}, got {self.kind!r}"


def sample_inputs_problems(inputs: tuple, preprocessing: dict):
    """The rules of the inputs and preprocessing the variant stages turn samples into feeds with."""
    if not inputs or any(set(i) != {"name", "shape", "dtype"} for i in inputs):
        yield "inputs must list each model input as {name, shape, dtype}"
    names = {i.get("name") for i in inputs}
    unknown = sorted(set(preprocessing) - names)
    if unknown:
        yield f"preprocessing names inputs the model does not have: {', '.join(unknown)}"


def load_data(ctx, kind_key: str, data: Samples) -> list[dict]:
    """The data set's samples as model inputs (the step's inputs `<kind_key>:<file>`, turned into
    feeds by its config's inputs and preprocessing); a bad sample is an error naming its file."""
    pre = {k: Preprocessing.from_dict(v) for k, v in ctx.cfg.preprocessing.items()}
    samples = []
    for name in data.files:
        try:
            samples.append(load_sample(ctx.input(f"{kind_key}:{name}"), data.kind,
                                       list(ctx.cfg.inputs), pre))
        except SampleError as exc:
            raise ctx.error(f"{kind_key} sample {exc}",
                            hint=f"fix or remove that file from the {kind_key} folder (every "
                                 f"sample must become the model's input: see `preprocessing:`)")
    if not samples:
        raise ctx.error(f"the {kind_key} set is empty", hint="add samples to its folder")
    return samples


def dataset_summary(ctx, key: str, data: Samples) -> dict:
    """A data set as reports name it: its files with their sha256, and one sha256 over them all."""
    files = [[n, sha256_file(ctx.input(f"{key}:{n}"))] for n in data.files]
    return {"kind": data.kind, "files": len(files), "sha256": sha256_text(canonical_json(files))}
