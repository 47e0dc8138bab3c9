"""The backend registry (issue 30, item 1) changed no artifact: a tiny model built for the host
gives the very bytes, and the very manifest entry (but the step keys, which hash the code), that
the tree before the registry gave. The figures were recorded from that tree in
tests/fixtures/backend_registry/host_tiny.json; an artifact is compared when this machine's
compile tools (versions, the linker's sha256) are the ones it was recorded with."""
from __future__ import annotations

import json

from conftest import FIXTURES, add_tiny_model

RECORDED = FIXTURES / "backend_registry" / "host_tiny.json"


def _without_step_keys(value, key: str | None = None):
    """The entry without its step keys, and with validation cosines to 12 digits: since the
    recording, the cosine's sums are exactly rounded (math.fsum, core/numerics.py) instead of
    BLAS dot products, which moves its last digits (the bytes and every other figure are equal)."""
    if isinstance(value, dict):
        return {k: _without_step_keys(v, k) for k, v in value.items()
                if k not in ("step_key", "database_step_key")}
    if isinstance(value, list):
        return [_without_step_keys(v, key) for v in value]
    if key in ("cosine", "min_cosine") and isinstance(value, float):
        return round(value, 12)
    return value


def test_the_registry_builds_the_bytes_and_manifest_of_the_tree_before_it(workspace):
    add_tiny_model(workspace.models, "tiny", seed=0)
    workspace.build("target=host")
    recorded = json.loads(RECORDED.read_text())
    manifest = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    entry = _without_step_keys(manifest["models"]["tiny"])
    recorded["model"] = _without_step_keys(recorded["model"])
    want = recorded["model"]["artifacts"]
    assert sorted(entry["artifacts"]) == sorted(want) == ["cpu-x86_64", "cpu-x86_64-tvm"]
    comparable = [abi for abi, art in entry["artifacts"].items()
                  if art["compile"]["tools"] == want[abi]["compile"]["tools"]]
    assert comparable, (f"no artifact was built with the recorded tools "
                        f"({ {a: w['compile']['tools'] for a, w in want.items()} }): the figures "
                        f"speak for those versions only")
    for abi in comparable:
        art = entry["artifacts"][abi]
        assert (art["path"], art["format"], art["sha256"], art["size"]) == (
            want[abi]["path"], want[abi]["format"], want[abi]["sha256"], want[abi]["size"]), abi
        assert art == want[abi], abi  # compile fields, requires, validation, tuning: the same
    if len(comparable) == len(want):  # the whole entry, coverage and choice included
        assert entry == recorded["model"]
        assert manifest["coverage"]["tiny"] == recorded["coverage"]
