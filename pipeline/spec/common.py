"""What every spec section shares: names, YAML reading, tolerances, and the typed documents.

Each section declares its part of the YAML as a `Doc` (pydantic: strict types, no unknown key)
beside the parser that turns it into a frozen spec. `validate` checks a whole document at once
and reports every problem, each naming the file and the key
(`models/x/model.yaml: inputs.x.shape[0]: ...`); the checks beyond structure (files, hashes, the
model's own signature, data sets) then run on what is valid, so that they are reported in the
same run. The JSON Schemas in docs/schema/ are exported from the same classes (schema.py).
"""
from __future__ import annotations

import copy
import functools
import os
import re
import types
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, create_model
from pydantic.fields import FieldInfo

from ..core.numerics import TOLERANCE_DEFAULTS

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


def read_yaml(path: Path, problems: list) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        problems.append(f"{display(path)}: cannot read it ({exc.strerror})")
        return None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        problems.append(yaml_problem(display(path), text, exc))
        return None


_YAML_WHY = (  # PyYAML's words for the usual slips, in the user's terms
    ("mapping values are not allowed", "a ':' where no key may start: is the line indented deeper "
                                       "than the key above it, or does a value need quotes?"),
    ("expected <block end>", "the line's indentation matches no key above it"),
    ("did not find expected key", "the line's indentation matches no key above it"),
)


def yaml_problem(where: str, text: str, exc: yaml.YAMLError) -> str:
    """A YAML syntax error as one problem: file, line and column (1-based, as editors count),
    what the parser found or expected there, the line itself, and the construct it was reading."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return f"{where}: cannot read YAML: {' '.join(str(exc).split())}"
    lines = text.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    shown = line.strip() if len(line.strip()) <= 60 else line.strip()[:57] + "..."
    found = f" at {shown!r}" if shown else " at the end of the file"
    if "\t" in line[:mark.column + 1] and "cannot start any token" in problem:
        problem += " (a tab: YAML indents with spaces)"
    problem += next((f" ({why})" for start, why in _YAML_WHY if problem.startswith(start)), "")
    context, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    since = (f" ({context}, from line {cmark.line + 1}, column {cmark.column + 1})"
             if context and cmark is not None and (cmark.line, cmark.column) != (mark.line, mark.column)
             else f" ({context})" if context else "")
    return (f"{where}: line {mark.line + 1}, column {mark.column + 1}: YAML syntax: {problem}"
            f"{found}{since}")


# ----------------------------------------------------------------------------- paths
def inside(folder: Path, value: str, where: str, problems: list) -> Path | None:
    """`value`, a path a model spec names, resolved in the model `folder`; None, with a problem
    appended, when it may lead out of that folder: an absolute path, a `..` that climbs out, or a
    symbolic link (itself or a folder on the way) whose target lies outside. Licenses ship in
    signed releases and every file named is hashed into step keys: a spec may name only files of
    its own folder, never whatever else the build machine can read."""
    root = Path(folder).resolve()
    if PurePath(value).is_absolute():
        why = "is an absolute path; paths in a model spec are relative to the model folder"
    elif os.path.normpath(value).split(os.sep)[0] == "..":
        why = "leads out of the model folder with '..'"
    else:
        try:
            path = (root / value).resolve()
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop
            problems.append(f"{where}: {value!r} cannot be resolved ({exc})")
            return None
        if path.is_relative_to(root):
            return path
        why = f"is or passes through a symbolic link to {path}, outside the model folder"
    problems.append(f"{where}: {value!r} {why}: copy the file into {display(root)}/ and name it "
                    f"relative to that folder")
    return None


def links_out(folder: Path, files, where: str, problems: list) -> bool:
    """Append a problem for each of `files` (found under a folder a spec names) that is a symbolic
    link leading out of the model `folder`; True when there is none."""
    root, clean = Path(folder).resolve(), True
    for path in files:
        target = Path(path).resolve()
        if not target.is_relative_to(root):
            problems.append(f"{where}: {Path(path).name} is a symbolic link to {target}, outside "
                            f"the model folder: copy the file into {display(root)}/ instead")
            clean = False
    return clean


# ----------------------------------------------------------------------------- documents
class Doc(BaseModel):
    """A mapping of a spec file: strict types (no "1" for 1, no 1 for true), no unknown key."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, regex_engine="python-re",
                              use_attribute_docstrings=True,  # they are the schema's descriptions
                              model_title_generator=lambda cls: cls.__name__.removesuffix("Doc"))


@dataclass(frozen=True)
class Says:
    """In `Annotated[...]`: the sentence for any problem with that value, instead of the generic
    one; `{input}` is replaced by the value found."""
    text: str


def one_or_many(item):
    """A value written either alone or as a list of them (`license: LICENSE` or `[A, B]`)."""
    return Annotated[Union[Annotated[item, Tag("one")], Annotated[list[item], Tag("many")]],
                     Discriminator(lambda v: "many" if isinstance(v, list) else "one")]


def as_list(value) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


CLOSED = {"additionalProperties": False}  # a mapping whose names have a pattern: no other names
Fraction = Annotated[float, Field(ge=0, le=1)]
NonNegative = Annotated[float, Field(ge=0)]


@dataclass(frozen=True)
class Tolerance:
    max_abs: float
    mean_abs: float
    cosine: float  # minimum cosine similarity
    integer_steps: int | None = None  # how far an integer output element may be off; None: not
    # given (an integer output is then exact, or max_abs steps when max_abs is a whole number >= 1)
    bool_mismatch: float = 0.0  # the fraction of a bool output's elements that may differ

    def as_dict(self) -> dict:
        """What core.numerics.compare takes; integer_steps where the spec gives it (a given 0
        keeps integer outputs exact whatever max_abs says), bool_mismatch where it is not 0 (a
        spec that gives neither keeps its step keys and records)."""
        steps = {} if self.integer_steps is None else {"integer_steps": self.integer_steps}
        odd = {} if self.bool_mismatch == TOLERANCE_DEFAULTS["bool_mismatch"] else {
            "bool_mismatch": self.bool_mismatch}
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "cosine": self.cosine,
                **steps, **odd}


class ToleranceDoc(Doc):
    """How close an artifact's outputs must be to the golden outputs. A float output must hold
    to all three of max_abs, mean_abs and cosine (to the first two alone when golden is within
    both of zero: its direction is noise); integer and bool outputs are compared element by
    element, exactly unless integer_steps or bool_mismatch allow more."""
    max_abs: NonNegative
    """the largest absolute difference of any output element"""
    mean_abs: NonNegative
    """the mean absolute difference over the output elements"""
    cosine: Fraction
    """the minimum cosine similarity of outputs and golden outputs"""
    integer_steps: Annotated[int, Field(ge=0)] = 0
    """how many steps an integer output element may be off (a quantized uint8/int8 output:
    quantization steps); 0: exact. Not given: max_abs, when it is a whole number of at least 1,
    is read as steps (a spec whose max_abs of 1 or more is no whole number is refused for a
    model with integer outputs); else exact"""
    bool_mismatch: Fraction = 0.0
    """the fraction of a bool output's elements that may differ; 0: exact"""

    def spec(self) -> Tolerance:
        steps = self.integer_steps if "integer_steps" in self.model_fields_set else None
        return Tolerance(self.max_abs, self.mean_abs, self.cosine, steps, self.bool_mismatch)


def check_via(arch: str | None, via: str | None, where: str, problems: list) -> bool:
    """A CPU ABI's run.via against its arch: python runs x86_64 here, qemu-user aarch64."""
    if arch is None or via is None:
        return False
    if via == "qemu" and arch != "aarch64":
        problems.append(f"{where}.run.via: qemu runs aarch64 artifacts only (arch is {arch!r})")
    elif via == "python" and arch != "x86_64":
        problems.append(f"{where}.run.via: python runs this machine's (x86_64) artifacts only")
    else:
        return True
    return False


# ----------------------------------------------------------------------------- validation
def validate(doc: type[Doc], raw, where: str, problems: list):
    """`raw` checked against `doc`, one problem per error appended. Returns the document; if it
    has errors, what is valid in it (each invalid value replaced by None, see `_lenient`) for the
    checks beyond structure; None if not even that (not a mapping at the top level)."""
    try:
        return doc.model_validate(raw)
    except ValidationError as exc:
        problems.extend(_problem(doc, err, where) for err in exc.errors())
    lenient, rest = _lenient(doc), copy.deepcopy(raw)
    for _ in range(8):  # each round removes what it was told about: a few rounds at most
        try:
            return lenient.model_validate(rest)
        except ValidationError as exc:
            for err in exc.errors():
                path = _walk(lenient, err["loc"])[0]
                cut = next((i for i, key in enumerate(path) if isinstance(key, int)), None)
                if (cut if cut is not None else len(path)) == 0:
                    return None
                _drop(rest, path[:cut], delete=cut is None and (
                    err["type"] == "extra_forbidden" or "[key]" in err["loc"]))
    return None


def _drop(rest, path: tuple, delete: bool) -> None:
    """Remove a key (unknown key, bad name) or set the value to None (a bad value: a list is
    replaced as a whole, a shape without one dim is another shape)."""
    for key in path[:-1]:
        rest = rest.get(key) if isinstance(rest, dict) else None
    if isinstance(rest, dict) and path[-1] in rest:
        if delete:
            del rest[path[-1]]
        else:
            rest[path[-1]] = None


_TYPES = {"int_type": "an integer", "float_type": "a number", "string_type": "a string",
          "bool_type": "true or false", "list_type": "a list", "dict_type": "a mapping",
          "model_type": "a mapping", "model_attributes_type": "a mapping"}


def _problem(doc: type[Doc], err: dict, where: str) -> str:
    """One pydantic error as a problem: `<file>: <key.path>: <sentence>`."""
    path, shown, model, tp, says = _walk(doc, err["loc"])
    kind, ctx, value = err["type"], err.get("ctx", {}), err["input"]
    got = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    if says:
        text = says.text.replace("{input}", got)
    elif kind in ("missing", "extra_forbidden"):
        shown = shown[:-1]
        text = (f"missing required key {path[-1]!r}" if kind == "missing" else
                f"unknown key {path[-1]!r} (allowed: {', '.join(sorted(model.model_fields))})")
    elif kind == "literal_error":
        text = f"{got} is not one of {', '.join(map(str, get_args(tp)))}"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        key = ctx["discriminator"].strip("'")
        if kind == "union_tag_not_found":
            text = f"missing required key {key!r}"
        else:
            shown = [*shown, f".{key}"]
            text = f"expected one of {ctx['expected_tags'].replace(chr(39), '')}, got {ctx['tag']!r}"
    elif kind in _TYPES:
        text = f"expected {_TYPES[kind]}{'' if err['loc'] else ' at the top level'}, got {got}"
        if kind == "float_type" and _looks_numeric(err.get("input")):
            text += (f" (YAML reads {err['input']} as text: write it with a dot and a signed "
                     f"exponent, e.g. 1.0e-5)")
    elif kind in ("greater_than_equal", "greater_than"):
        text = f"must be {'>=' if 'ge' in ctx else '>'} {_num(ctx.get('ge', ctx.get('gt')))}, got {got}"
    elif kind == "less_than_equal":
        text = f"at most {_num(ctx['le'])}, got {got}"
    elif kind == "too_short":
        text = f"expected at least {ctx['min_length']} item(s), got {ctx['actual_length']}"
    elif kind == "string_too_short":
        text = "must not be empty"
    elif kind == "string_pattern_mismatch":
        text = f"{got} does not match {ctx['pattern']}"
    else:
        text = err["msg"]
    key = "".join(shown).lstrip(".")
    return f"{where}: {key}: {text}" if key else f"{where}: {text}"


def _num(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _walk(doc: type[Doc], loc: tuple):
    """An error's location walked through the document's types: the keys in the YAML (a union's
    tag is none), those keys as shown (`.name`, `[0]`), the innermost Doc class on the way,
    the type found there and its Says."""
    path, shown, model, tp = [], [], doc, doc
    items = list(loc)
    while items:
        item = items.pop(0)
        tp, meta = _unwrap(tp)
        origin = get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            model, field = tp, tp.model_fields.get(item)
            tp = _annotation(field) if field else None
        elif origin in (Union, types.UnionType):
            tp = next((m for m in get_args(tp) if item in _tags(m, meta)), tp)
            continue
        elif origin is dict:
            key_type, tp = get_args(tp)
            if items[:1] == ["[key]"]:
                items.pop(0)
                tp = key_type
        elif origin is list:
            tp = get_args(tp)[0]
        path.append(item)
        shown.append(f"[{item}]" if origin is list else f".{item}")
    tp, meta = _unwrap(tp)
    return tuple(path), shown, model, tp, next((m for m in meta if isinstance(m, Says)), None)


def _annotation(field: FieldInfo):
    tp = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return Annotated[tp, Field(discriminator=field.discriminator)] if field.discriminator else tp


def _unwrap(tp) -> tuple[Any, list]:
    """Annotated and Optional taken off: the type and the metadata of the outermost Annotated
    found (a union's discriminator, a Says)."""
    meta = []
    while True:
        if get_origin(tp) is Annotated:
            meta = [*tp.__metadata__, *meta]
            tp = tp.__origin__
        elif get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return Union[tuple(rest)], meta
            tp = rest[0]
        else:
            return tp, meta


def _tags(member, union_meta: list) -> set:
    """The tags by which a discriminated union picks `member`."""
    tp, meta = _unwrap(member)
    tags = {m.tag for m in meta if isinstance(m, Tag)}
    key = next((m.discriminator for m in union_meta
                if isinstance(m, FieldInfo) and isinstance(m.discriminator, str)), None)
    if key and isinstance(tp, type) and issubclass(tp, BaseModel):
        tags |= set(get_args(tp.model_fields[key].annotation))
    elif key and get_origin(tp) in (Union, types.UnionType):
        tags |= {t for m in get_args(tp) for t in _tags(m, union_meta)}
    return tags


@functools.cache
def _lenient(doc: type[Doc]) -> type[Doc]:
    """The twin of a document class where every field and every mapping value may be None:
    what is left of a document once its invalid values are replaced by None validates with it.
    A field of one possible value stays: it is what a discriminated union picks the class by."""
    fields = {name: (Optional[_lenient_type(_annotation(f))], None if f.is_required() else f.default)
              for name, f in doc.model_fields.items()
              if not (get_origin(f.annotation) is Literal and len(get_args(f.annotation)) == 1)}
    return create_model(doc.__name__, __base__=doc, **fields)


def _lenient_type(tp):
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return Annotated[(_lenient_type(tp.__origin__), *tp.__metadata__)]
    if isinstance(tp, type) and issubclass(tp, Doc):
        return _lenient(tp)
    if origin in (Union, types.UnionType):
        return Union[tuple(_lenient_type(a) for a in args)]
    if origin is dict:
        return dict[args[0], Optional[_lenient_type(args[1])]]
    if origin is list:
        return list[_lenient_type(args[0])]
    return tp


def given(doc: Doc | None, key: str) -> bool:
    """Whether the YAML sets `key` (a default is not given; a bad value, set to None, is)."""
    return doc is not None and key in doc.model_fields_set


def _looks_numeric(value) -> bool:
    """A string that Python reads as a number but YAML 1.1 does not (1e-5, 1E3, .5e2)."""
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True
