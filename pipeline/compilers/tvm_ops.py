"""The ONNX ops TVM's ONNX frontend converts, recorded per apache-tvm version in tvm_onnx_ops.json.

Loading the project must not import TVM: the coverage prediction looks the op list up here.

    python -m pipeline.compilers.tvm_ops --refresh    # after installing another apache-tvm

Table layout: {"format": 1, "versions": {apache-tvm version: [sorted op names]}}.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.store import pretty_json
from .recorded import RecordedTable

TABLE = Path(__file__).with_name("tvm_onnx_ops.json")
DISTRIBUTION = "apache-tvm"

def supported_ops(tvm_version: str) -> set[str] | None:
    """The ops recorded for that apache-tvm version; None when the table has no entry for it."""
    ops = RECORDED.entry(tvm_version)
    return set(ops) if ops is not None else None


def installed_version() -> str:
    return RECORDED.installed_version()


def load_table(path: Path = TABLE) -> dict:
    return json.loads(Path(path).read_text())


def render(table: dict) -> str:
    return pretty_json(table)


def live_ops() -> set[str]:
    """The ops the installed TVM's ONNX frontend converts (its converter map, plus If/Constant
    which it handles itself: see `_check_for_unsupported_ops` in tvm.relax.frontend.onnx)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map  # tvm: 2.8 s, not needed by doit list
    return set(_get_convert_map()) | {"If", "Constant"}


RECORDED = RecordedTable(TABLE, DISTRIBUTION, ask=lambda: sorted(live_ops()))


if __name__ == "__main__":
    raise SystemExit(RECORDED.main(None, __doc__.splitlines()[0],
                                   lambda v: f"{len(supported_ops(v))} ops"))
