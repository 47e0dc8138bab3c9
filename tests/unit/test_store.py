"""Keys, the content-addressed store, atomic writes and the hash memo."""
from __future__ import annotations

import os

from pipeline.core.store import (HashMemo, Store, atomic_write_text, canonical_json, step_key)


def test_keys_are_full_sha256_of_canonical_json():
    a = step_key({"stage": "x", "config": {"b": 1, "a": [1, 2]}})
    b = step_key({"config": {"a": [1, 2], "b": 1}, "stage": "x"})
    assert a == b and len(a) == 64
    assert a != step_key({"stage": "x", "config": {"b": 2, "a": [1, 2]}})
    assert canonical_json({"b": 1, "a": 2}) == '{"a":2,"b":1}'


def test_store_put_lookup_restore_and_corruption(tmp_path):
    store = Store(tmp_path / "store")
    src = tmp_path / "out.bin"
    src.write_bytes(b"artifact bytes")
    outputs = store.put("k" * 64, "demo", {"out.bin": src})
    assert store.lookup("k" * 64) == outputs
    assert store.lookup("z" * 64) is None
    dest = tmp_path / "restored"
    store.restore(outputs, dest)
    assert (dest / "out.bin").read_bytes() == b"artifact bytes"
    # a truncated object makes the key unusable rather than restoring bad bytes
    obj = next((tmp_path / "store" / "objects").rglob("*"))
    while obj.is_dir():
        obj = next(obj.iterdir())
    obj.write_bytes(b"art")
    assert store.lookup("k" * 64) is None


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    target = tmp_path / "a" / "file.json"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.json"]


def test_hash_memo_reuses_and_notices_changes(tmp_path):
    memo_path = tmp_path / "memo.json"
    f = tmp_path / "data"
    f.write_bytes(b"one")
    memo = HashMemo(memo_path)
    first = memo.sha256(f)
    memo.save()
    again = HashMemo(memo_path)
    assert again.sha256(f) == first and not again.dirty
    f.write_bytes(b"two!")
    os.utime(f, ns=(1, 1))
    assert again.sha256(f) != first
