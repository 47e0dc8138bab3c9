"""Data sets for precision variants (calibration, evaluation) and the one preprocessing that turns
their files into model inputs.

A data set is a folder of the model's own samples, one file per sample, in name order:
  images  .png .jpg .jpeg .bmp .ppm .pgm   through the spec's `preprocessing:` for the input
  arrays  .npy                              one model input, exactly its shape and dtype (the
                                            batch dim may be left out); no preprocessing
          .npz                              every model input by name, same rules
README*, LICENSE*, *.md, *.txt and dot-files are documentation, not samples; any other file is
an error. The set's identity is the sha256 of every file (each is a step input, so it is part of
the step keys), summarised in reports as one sha256 over the sorted (name, sha256) pairs.

Preprocessing (`preprocessing: {input: {...}}` in model.yaml), applied in this order:
  color   rgb | bgr | gray                      what the image is converted to (default rgb)
  resize  none | stretch | keep_ratio           none: the image must already be the input's H x W;
                                                stretch: to H x W; keep_ratio: to height H, width
                                                min(W, ceil(H * w / h)), then padded on the right
  pad     the value written into that padding, after normalisation (default 0.0)
  scale   pixels (0..255) are multiplied by it (default 1/255)
  mean, std   then (x - mean) / std, per channel (one value or one per channel; default 0, 1)
  layout  NCHW | NHWC                           (default NCHW); a batch dim of 1 is added
and the result is cast to the input's dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image, UnidentifiedImageError

from .common import Doc, as_list, links_out, one_or_many


IMAGE_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm")
ARRAY_EXT = (".npy", ".npz")
COLORS = ("rgb", "bgr", "gray")
RESIZES = ("none", "stretch", "keep_ratio")
LAYOUTS = ("NCHW", "NHWC")


class SampleError(ValueError):
    """A sample file that cannot become a model input (the message names the file)."""


def _is_doc(path: Path) -> bool:
    name = path.name
    return (name.startswith(".") or name.upper().startswith(("README", "LICENSE"))
            or path.suffix.lower() in (".md", ".txt"))


# ----------------------------------------------------------------------------- data sets
@dataclass(frozen=True)
class Dataset:
    folder: Path
    files: tuple[Path, ...]
    kind: str  # "image", "npy" or "npz"

    def as_dict(self) -> dict:
        """As step configs hold it: the files' contents are the steps' inputs (and keys)."""
        return {"kind": self.kind, "files": [p.name for p in self.files]}


def list_dataset(folder: Path | None, where: str, problems: list,
                 model_dir: Path | None = None) -> Dataset | None:
    """The samples of a data folder, or None with the problems appended (missing, empty, mixed,
    a sample that is a symbolic link out of `model_dir`). None for `folder` (a path that was
    refused already) gives None."""
    if folder is None:
        return None
    if not folder.is_dir():
        problems.append(f"{where}: folder not found: {folder}")
        return None
    files, odd = [], []
    for path in sorted(folder.iterdir()):
        if path.is_dir() or _is_doc(path):
            continue
        (files if path.suffix.lower() in IMAGE_EXT + ARRAY_EXT else odd).append(path)
    if odd:
        problems.append(f"{where}: {folder}: not a sample file: {', '.join(p.name for p in odd[:5])}"
                        f" (samples are {' '.join(IMAGE_EXT + ARRAY_EXT)})")
        return None
    if model_dir is not None and not links_out(model_dir, files, f"{where}: {folder}", problems):
        return None
    if not files:
        problems.append(f"{where}: {folder}: empty data set: no sample files "
                        f"({' '.join(IMAGE_EXT + ARRAY_EXT)})")
        return None
    kinds = {"image" if p.suffix.lower() in IMAGE_EXT else p.suffix.lower()[1:] for p in files}
    if len(kinds) > 1:
        problems.append(f"{where}: {folder}: mixes {' and '.join(sorted(kinds))} files; "
                        f"one kind per data set")
        return None
    return Dataset(folder.resolve(), tuple(p.resolve() for p in files), kinds.pop())


# ----------------------------------------------------------------------------- preprocessing
@dataclass(frozen=True)
class Preprocessing:
    input: str
    color: str = "rgb"
    resize: str = "none"
    pad: float = 0.0
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str = "NCHW"

    def as_dict(self) -> dict:
        return {"input": self.input, "color": self.color, "resize": self.resize, "pad": self.pad,
                "scale": self.scale, "mean": list(self.mean), "std": list(self.std),
                "layout": self.layout}

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocessing":
        return cls(**{**d, "mean": tuple(d["mean"]), "std": tuple(d["std"])})


class PreprocessingDoc(Doc):
    """How an image file of a data set becomes the input, in this order (docs/variants.md)."""
    color: Literal[COLORS] = "rgb"
    """what the image is converted to"""
    resize: Literal[RESIZES] = "none"
    """none: the image is the input's H x W already; stretch: to H x W; keep_ratio: to height H,
    then padded on the right"""
    pad: float = 0.0
    """the value of that padding, after normalisation"""
    scale: float = 1 / 255
    """pixels (0..255) are multiplied by it"""
    mean: one_or_many(float) = 0.0
    """then (x - mean) / std: one value or one per channel"""
    std: one_or_many(float) = 1.0
    layout: Literal[LAYOUTS] = "NCHW"
    """a batch dim of 1 is added"""


def parse_preprocessing(doc, inputs: dict, where: str, problems: list) -> dict:
    """`preprocessing:` -> {input name: Preprocessing}; inputs: name -> (shape, dtype) of the
    spec's inputs, None for one that is not valid."""
    out = {}
    for name, body in (doc or {}).items():
        pw = f"{where}: preprocessing.{name}"
        if name not in inputs:
            problems.append(f"{pw}: the model has no input named {name!r} (it has: "
                            f"{', '.join(inputs)})")
            continue
        if body is None or inputs[name] is None:
            continue
        before = len(problems)
        shape, _ = inputs[name]
        channels = None
        if len(shape) != 4 or shape[0] != 1:
            problems.append(f"{pw}: images feed a [1, C, H, W] or [1, H, W, C] input; "
                            f"{name} is {list(shape)}")
        elif body.layout is not None:
            channels = shape[1] if body.layout == "NCHW" else shape[3]
            want = 1 if body.color == "gray" else 3
            if body.color is not None and channels != want:
                problems.append(f"{pw}: color {body.color} gives {want} channel(s), input {name} "
                                f"({body.layout}) has {channels}")
        stats = {"mean": tuple(as_list(body.mean)), "std": tuple(as_list(body.std))}
        for key, values in stats.items():
            if channels and len(values) not in (1, channels):
                problems.append(f"{pw}.{key}: give one value or {channels} (one per channel), "
                                f"got {len(values)}")
        if any(v == 0 for v in stats["std"]):
            problems.append(f"{pw}.std: must not be 0")
        if len(problems) == before:
            out[name] = Preprocessing(name, body.color, body.resize, body.pad, body.scale,
                                      stats["mean"], stats["std"], body.layout)
    return out


def image_to_input(path: Path, pre: Preprocessing, shape, dtype: str):
    """One image file -> one model input array, as the preprocessing says."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list

    h, w = (shape[2], shape[3]) if pre.layout == "NCHW" else (shape[1], shape[2])
    try:
        with Image.open(path) as img:
            img = img.convert("L" if pre.color == "gray" else "RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise SampleError(f"{path.name}: cannot read the image ({exc})") from None
    if pre.resize == "none":
        if (img.height, img.width) != (h, w):
            raise SampleError(f"{path.name}: image is {img.width}x{img.height} (WxH), input "
                              f"{pre.input} takes {w}x{h} and preprocessing.resize is none")
        width = w
    elif pre.resize == "stretch":
        img, width = img.resize((w, h), Image.Resampling.BILINEAR), w
    else:  # keep_ratio: to height h, at most w wide, pad the rest on the right
        width = max(1, min(w, math.ceil(h * img.width / img.height)))
        img = img.resize((width, h), Image.Resampling.BILINEAR)
    pixels = np.asarray(img, dtype=np.float32)
    pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
    if pre.color == "bgr":
        pixels = pixels[:, :, ::-1]
    mean = np.asarray(pre.mean, np.float32)
    std = np.asarray(pre.std, np.float32)
    values = (pixels * np.float32(pre.scale) - mean) / std
    out = np.full((h, w, values.shape[2]), pre.pad, dtype=np.float32)
    out[:, :width] = values
    out = out.transpose(2, 0, 1) if pre.layout == "NCHW" else out
    return np.ascontiguousarray(out[None]).astype(dtype)


def _array(path: Path, array, name: str, shape, dtype: str):
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    shape = tuple(shape)
    if array.shape == shape[1:] and shape[0] == 1:
        array = array[None]
    if array.shape != shape or array.dtype != np.dtype(dtype):
        raise SampleError(f"{path.name}: input {name} is {array.dtype}{list(array.shape)}, the "
                          f"model takes {dtype}{list(shape)}")
    return array


def load_sample(path: Path, kind: str, inputs: list[dict], preprocessing: dict) -> dict:
    """One sample file -> {input name: array}. inputs: [{name, shape, dtype}] of the model;
    preprocessing: {input name: Preprocessing} (images only)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if kind == "image":
        (spec,) = inputs  # the spec check allows images for single-input models only
        return {spec["name"]: image_to_input(path, preprocessing[spec["name"]], spec["shape"],
                                             spec["dtype"])}
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise SampleError(f"{path.name}: not a readable {kind} file ({exc})") from None
    if kind == "npy":
        (spec,) = inputs
        return {spec["name"]: _array(path, data, spec["name"], spec["shape"], spec["dtype"])}
    with data:
        names = sorted(data.files)
        want = sorted(s["name"] for s in inputs)
        if names != want:
            raise SampleError(f"{path.name}: holds arrays {names}, the model's inputs are {want}")
        return {s["name"]: _array(path, data[s["name"]], s["name"], s["shape"], s["dtype"])
                for s in inputs}


def check_dataset_fits(dataset: Dataset, inputs: dict, preprocessing: dict, where: str,
                       problems: list) -> None:
    """Spec-time checks that need no file reading: images need one input with preprocessing."""
    if dataset.kind in ("image", "npy") and len(inputs) != 1:
        problems.append(f"{where}: {dataset.kind} samples feed a single-input model; this one has "
                        f"{len(inputs)} inputs: use .npz files holding every input by name")
    elif dataset.kind == "image" and next(iter(inputs)) not in preprocessing:
        problems.append(f"{where}: image samples need `preprocessing: {{{next(iter(inputs))}: "
                        f"...}}` in the model spec (resize, scale, mean, std, layout)")
