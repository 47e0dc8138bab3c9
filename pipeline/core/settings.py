"""Project-wide settings a user sets once: a doit variable, else an environment variable, else
the `[tool.modelyard]` table of the project's pyproject.toml.

    [tool.modelyard]
    cache = "http://cache.internal:8080/modelyard"   # remote cache URL (see core/remote.py)
    cache_push = false                                # pull-only unless a trusted job says so
    cache_pubkey = "keys/cache.pub"                  # records not signed by it are ignored
    verify_key = "keys/release.pub"                  # the key `doit verify` requires
    executor = "dask"                                 # run steps on a Dask cluster (core/dask_executor.py)
    scheduler = "tcp://builder.internal:8786"         # its scheduler

Relative paths in the table are relative to the folder of that pyproject.toml.
"""
from __future__ import annotations

import os
import tomllib
from functools import lru_cache
from pathlib import Path

from .errors import PipelineError

TRUE = ("1", "true", "yes", "on")


@lru_cache(maxsize=None)
def _table(pyproject: Path) -> dict:
    try:
        with open(pyproject, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as err:
        raise PipelineError(f"{pyproject}: not valid TOML ({err})", stage="settings",
                            hint="fix the file; modelyard reads its [tool.modelyard] table") from None
    return doc.get("tool", {}).get("modelyard", {}) or {}


def project_file(root: Path | None = None) -> Path:
    return Path(root or Path.cwd()) / "pyproject.toml"


def setting(name: str, given=None, env: str | None = None, root: Path | None = None,
            path: bool = False):
    """The value of setting `name`: `given` (a doit variable) if not None, else $`env`, else
    [tool.modelyard].`name` of root/pyproject.toml (root: the current folder), else None.
    With path=True a value from the table is made absolute against the table's folder."""
    if given is not None:
        return given
    if env and os.environ.get(env):
        return os.environ[env]
    pyproject = project_file(root)
    value = _table(pyproject.resolve()).get(name)
    if value is not None and path:
        value = str((pyproject.parent / str(value)).resolve())
    return value


def flag(name: str, given=None, env: str | None = None, root: Path | None = None) -> bool:
    """A boolean setting (1/true/yes/on, or a TOML boolean)."""
    value = setting(name, given, env, root)
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in TRUE if value is not None else False
