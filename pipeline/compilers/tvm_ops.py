"""The ONNX ops TVM's ONNX frontend converts, recorded per apache-tvm version in tvm_onnx_ops.json.

Loading the project must not import TVM: the coverage prediction looks the op list up here.

    python -m pipeline.compilers.tvm_ops --refresh    # after installing another apache-tvm

Table layout: {"format": 1, "versions": {apache-tvm version: [sorted op names]}}.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.store import pretty_json

TABLE = Path(__file__).with_name("tvm_onnx_ops.json")
DISTRIBUTION = "apache-tvm"
FORMAT = 1

_CACHE: dict = {}


def load_table(path: Path = TABLE) -> dict:
    return json.loads(Path(path).read_text())


def supported_ops(tvm_version: str) -> set[str] | None:
    """The ops recorded for that apache-tvm version; None when the table has no entry for it."""
    if "table" not in _CACHE:
        _CACHE["table"] = load_table()["versions"]
    ops = _CACHE["table"].get(tvm_version)
    return set(ops) if ops is not None else None


def installed_version() -> str:
    import importlib.metadata
    return importlib.metadata.version(DISTRIBUTION)


def live_ops() -> set[str]:
    """The ops the installed TVM's ONNX frontend converts (its converter map, plus If/Constant
    which it handles itself: see `_check_for_unsupported_ops` in tvm.relax.frontend.onnx)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map
    return set(_get_convert_map()) | {"If", "Constant"}


def render(table: dict) -> str:
    return pretty_json(table)


def refresh(path: Path = TABLE) -> str:
    """Rewrite the table's entry for the installed apache-tvm version (other versions are kept)."""
    table = load_table(path) if Path(path).is_file() else {"format": FORMAT, "versions": {}}
    version = installed_version()
    table["versions"][version] = sorted(live_ops())
    Path(path).write_text(render(table))
    _CACHE.clear()
    return version


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refresh", action="store_true",
                        help="ask the installed TVM and rewrite the table")
    args = parser.parse_args(argv)
    if not args.refresh:
        parser.print_help()
        return 2
    version = refresh()
    print(f"{TABLE}: apache-tvm {version}: {len(supported_ops(version))} ops")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
