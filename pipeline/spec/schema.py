"""JSON Schemas of model.yaml and the target files, exported from the typed specs.

    python -m pipeline.spec.schema --write    # docs/schema/model.schema.json, target.schema.json
    python -m pipeline.spec.schema --check    # exit 1 if those files are not what the code says

Editors that speak yaml-language-server complete and check a spec file whose first line is
`# yaml-language-server: $schema=../../docs/schema/model.schema.json`. The schemas say what the
structure of a file is (keys, types, choices, bounds); what needs the files around it (a source's
sha256, the model's own inputs, data sets) only the build checks.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic.json_schema import GenerateJsonSchema

from .model import ModelDoc
from .target import TargetDoc

DOCS = Path(__file__).resolve().parents[2] / "docs" / "schema"
SCHEMAS = {"model.schema.json": ModelDoc, "target.schema.json": TargetDoc}


class _Generate(GenerateJsonSchema):
    def default_schema(self, schema):
        """A key that may be left out but not be null (`key: str = None`) has no default shown:
        an editor would write the null."""
        if schema.get("default", 0) is None and schema["schema"]["type"] != "nullable":
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)


def schema(doc) -> dict:
    return {"$schema": GenerateJsonSchema.schema_dialect,
            **doc.model_json_schema(schema_generator=_Generate)}


def render(doc) -> str:
    """Deterministic text: sorted keys, indent 2, a trailing newline."""
    return json.dumps(schema(doc), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stale(folder: Path = DOCS) -> list[str]:
    """The schema files in `folder` that differ from what the code generates."""
    return [name for name, doc in SCHEMAS.items()
            if not (folder / name).is_file() or (folder / name).read_text() != render(doc)]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        DOCS.mkdir(parents=True, exist_ok=True)
        for name, doc in SCHEMAS.items():
            (DOCS / name).write_text(render(doc))
            print(f"wrote {DOCS / name}")
        return 0
    if argv == ["--check"]:
        for name in stale():
            print(f"{DOCS / name} is not current: run python -m pipeline.spec.schema --write")
        return 1 if stale() else 0
    print("usage: python -m pipeline.spec.schema --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
