"""What every spec section shares: names, numbers, the problem list, YAML reading, tolerances.

Spec parsing reports every problem at once, each naming the file and the key
(`models/x/model.yaml: inputs.x.shape[0]: ...`): parsers append sentences to a `Problems` list
and return None for the part they could not read, instead of raising at the first one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import unknown_keys

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

try:
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _Loader = yaml.SafeLoader



def display(path: Path) -> str:
    """A path as shown in messages: relative to the working folder when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Tolerance:
    max_abs: float
    mean_abs: float
    cosine: float  # minimum cosine similarity

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "cosine": self.cosine}


class Problems(list):
    def unknown(self, where: str, got: dict, allowed: set) -> None:
        unknown_keys(self, where, got, allowed)


def read_yaml(path: Path, problems: Problems) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError) as exc:
        problems.append(f"{path}: cannot read YAML: {str(exc).splitlines()[0]}")
        return None


def number(value, where: str, problems: Problems, kind=float, minimum=None):
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        problems.append(f"{where}: expected a {'number' if kind is float else 'integer'}, got {value!r}")
        return None
    if minimum is not None and value < minimum:
        problems.append(f"{where}: must be >= {minimum}, got {value!r}")
        return None
    return kind(value)
