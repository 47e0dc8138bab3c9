"""The self-healing local store, the remote cache over file:// (no server), signed key records,
the cache commands. The HTTP side, with real servers, is tests/e2e/test_remote_cache.py."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import remote, signing as core_signing, store
from pipeline.core.errors import PipelineError
from pipeline.core.store import DamagedObject, Store, atomic_write_text
from pipeline.release import cache, signing

REPO = Path(__file__).resolve().parents[2]
KEY_A, KEY_B, KEY_C = "a" * 64, "b" * 64, "c" * 64


@pytest.fixture(autouse=True)
def no_cache_configured(monkeypatch):
    """Each test starts with no cache and leaves none behind (configure sets module globals)."""
    monkeypatch.setattr(store, "_remote", None)
    monkeypatch.setattr(store, "_stats", None)


def outputs_in(folder: Path, **files: bytes) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in files}


def flip_byte(path: Path, at: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("modelyard:")]


# ---- the local store ---------------------------------------------------------------------------

def test_atomic_writes_and_store_objects_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        st = Store(tmp_path / "store")
        out = st.put(KEY_A, "demo", outputs_in(tmp_path / "out", **{"x.bin": b"bytes"}))
        mode = stat.S_IMODE(st.object_path(out["x.bin"]["sha256"]).stat().st_mode)
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
        assert mode == 0o640
        assert stat.S_IMODE(st.record_path(KEY_A).stat().st_mode) == 0o640
    finally:
        os.umask(old)
    atomic_write_text(tmp_path / "b.json", "{}")
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o666 & ~old


@pytest.mark.parametrize("damage", ["flipped", "truncated", "gone"])
def test_restore_evicts_a_damaged_object_and_raises(tmp_path, capsys, damage):
    st = Store(tmp_path / "store")
    payload = bytes(range(256)) * 64
    out = st.put(KEY_A, "demo", outputs_in(tmp_path / "out", **{"m.bin": payload}))
    obj = st.object_path(out["m.bin"]["sha256"])
    if damage == "flipped":
        flip_byte(obj)
    elif damage == "truncated":
        obj.write_bytes(payload[:100])
    else:
        obj.unlink()
    assert st.lookup(KEY_A) == (out if damage == "flipped" else None)  # sizes only: cheap
    with pytest.raises(DamagedObject, match=f"store object {obj} \\(m.bin\\)") as err:
        st.restore(out, tmp_path / "into")
    assert isinstance(err.value, OSError)
    assert not obj.exists() and not (tmp_path / "into" / "m.bin").exists()
    assert st.lookup(KEY_A) is None
    lines = warnings(capsys)
    if damage == "gone":
        assert lines == []  # nothing to evict
    else:
        assert len(lines) == 1 and str(obj) in lines[0] and "evicted" in lines[0], lines
    # the step runs again and its put repairs the store
    st.put(KEY_A, "demo", {"m.bin": tmp_path / "out" / "m.bin"})
    st.restore(st.lookup(KEY_A), tmp_path / "again")
    assert (tmp_path / "again" / "m.bin").read_bytes() == payload


def test_put_replaces_a_damaged_object_of_the_same_size(tmp_path):
    st = Store(tmp_path / "store")
    files = outputs_in(tmp_path / "out", **{"m.bin": b"0123456789" * 100})
    out = st.put(KEY_A, "demo", files)
    obj = st.object_path(out["m.bin"]["sha256"])
    flip_byte(obj)
    st.put(KEY_B, "demo", files)  # another key with the same output bytes
    assert obj.read_bytes() == b"0123456789" * 100
    assert sorted(p.name for p in obj.parent.iterdir()) == [obj.name]


def test_a_failed_put_leaves_no_temporary_file_and_no_record(tmp_path):
    """A real write failure: the file size limit (RLIMIT_FSIZE) stops the object's copy."""
    script = f"""
import resource, signal, sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from pipeline.core.store import Store
root = Path({str(tmp_path)!r})
(root / "big.bin").write_bytes(b"x" * 200_000)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
try:
    Store(root / "store").put({KEY_A!r}, "demo", {{"big.bin": root / "big.bin"}})
except OSError as exc:
    print("FAILED", exc.errno)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "FAILED 27" in proc.stdout, proc.stdout + proc.stderr  # EFBIG
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert left == [], left


def test_verify_evicts_damaged_objects_and_drops_their_records(tmp_path, capsys):
    art = tmp_path / "artifacts"
    st = Store(art / ".store")
    good = st.put(KEY_A, "demo", outputs_in(tmp_path / "a", **{"a.bin": b"a" * 1000}))
    bad = st.put(KEY_B, "demo", outputs_in(tmp_path / "b", **{"b.bin": b"b" * 1000}))
    flip_byte(st.object_path(bad["b.bin"]["sha256"]))
    (st.root / "keys" / f"{KEY_C}.json").write_text("not json")
    summary = st.verify()
    assert summary["damaged"] == [bad["b.bin"]["sha256"]]
    assert sorted(summary["dropped"]) == [KEY_B, KEY_C]
    assert summary["objects"] == 1 and summary["records"] == 1 and summary["bytes"] == 1000
    assert st.lookup(KEY_A) == good and st.lookup(KEY_B) is None
    assert len(warnings(capsys)) == 1
    assert cache.verify(art).endswith("all intact")
    flip_byte(st.object_path(good["a.bin"]["sha256"]))
    text = cache.verify(art)
    assert "evicted 1 damaged objects" in text and "dropped 1 records" in text, text


# ---- the remote over file:// ------------------------------------------------------------------

def test_file_remote_pushes_then_another_store_pulls_checked(tmp_path):
    url = f"file://{tmp_path / 'remote'}"
    store.configure(tmp_path / "ci", url=url, push=True)
    pusher = Store(tmp_path / "ci" / ".store")
    payload = os.urandom(300_000)
    out = pusher.put(KEY_A, "compile", outputs_in(tmp_path / "out", **{"m.vmfb": payload,
                                                                       "flags.json": b"{}"}))
    served = sorted(p.relative_to(tmp_path / "remote").as_posix()
                    for p in (tmp_path / "remote").rglob("*") if p.is_file())
    assert served == [f"ac/{KEY_A}"] + sorted(f"cas/{m['sha256']}" for m in out.values())
    record = json.loads((tmp_path / "remote" / "ac" / KEY_A).read_text())
    assert record == {"key": KEY_A, "stage": "compile", "outputs": out}

    store.configure(tmp_path / "laptop", url=url)  # pull-only: the default
    puller = Store(tmp_path / "laptop" / ".store")
    assert puller.lookup(KEY_B) is None
    assert puller.lookup(KEY_A) == out
    puller.restore(out, tmp_path / "restored")
    assert (tmp_path / "restored" / "m.vmfb").read_bytes() == payload
    puller.put(KEY_C, "other", outputs_in(tmp_path / "o", **{"x": b"x"}))  # not pushed
    assert not (tmp_path / "remote" / "ac" / KEY_C).exists()
    assert puller.lookup(KEY_A) == out  # now a local hit
    store.flush_stats()
    stats = remote.read_stats(tmp_path / "laptop")
    assert stats["remote"] == url and stats["push"] is False
    c = stats["counts"]
    assert (c["lookups"], c["local_hits"], c["remote_hits"], c["remote_misses"]) == (3, 1, 1, 1)
    assert (c["objects_pulled"], c["bytes_pulled"], c["stored"]) == (2, len(payload) + 2, 1)
    text = cache.status(tmp_path / "laptop")
    assert "3 lookups: 1 (33 %) local hits, 1 (33 %) remote hits, 1 (33 %) misses" in text
    assert f"remote cache  {url}: pull-only" in text


def test_a_damaged_remote_object_is_discarded_and_counted(tmp_path, capsys):
    url = f"file://{tmp_path / 'remote'}"
    store.configure(tmp_path / "ci", url=url, push=True)
    out = Store(tmp_path / "ci" / ".store").put(KEY_A, "demo",
                                                outputs_in(tmp_path / "out", **{"m": b"m" * 5000}))
    digest = out["m"]["sha256"]
    flip_byte(tmp_path / "remote" / "cas" / digest)
    store.configure(tmp_path / "b", url=url)
    puller = Store(tmp_path / "b" / ".store")
    assert puller.lookup(KEY_A) is None
    assert not puller.object_path(digest).exists()
    assert list((puller.root / "objects").rglob(".*")) == []  # the temporary download is gone
    (line,) = warnings(capsys)
    assert f"discarding the damaged object cas/{digest}" in line and "runs locally" in line
    assert store.configured_remote().down is None  # damage is not a fault: the remote stays on


def test_signed_records_are_required_when_a_public_key_is_set(tmp_path, capsys):
    keys = tmp_path / "keys"
    signing.generate(keys / "cache.pem")
    signing.generate(keys / "other.pem")
    url = f"file://{tmp_path / 'remote'}"
    files = outputs_in(tmp_path / "out", **{"m": b"model"})
    store.configure(tmp_path / "signer", url=url, push=True, signing_key=str(keys / "cache.pem"))
    Store(tmp_path / "signer" / ".store").put(KEY_A, "demo", files)
    store.configure(tmp_path / "plain", url=url, push=True)
    Store(tmp_path / "plain" / ".store").put(KEY_B, "demo", files)
    signed = json.loads((tmp_path / "remote" / "ac" / KEY_A).read_text())
    assert signed["signature"]["key_id"] == core_signing.key_id(
        core_signing.load_public_key(str(keys / "cache.pem.pub")))

    def pull(name, pubkey, key):
        store.configure(tmp_path / name, url=url, pubkey=pubkey)
        return Store(tmp_path / name / ".store").lookup(key)

    assert pull("trusting", str(keys / "cache.pem.pub"), KEY_A) is not None
    assert pull("no-pin", None, KEY_B) is not None  # no public key: unsigned records are taken
    assert warnings(capsys) == []
    assert pull("strict", str(keys / "cache.pem.pub"), KEY_B) is None  # unsigned
    assert Store(tmp_path / "strict" / ".store").lookup(KEY_B) is None
    (line,) = warnings(capsys)  # once per process, however many records
    assert "not signed by the cache public key" in line and "unsigned" in line
    assert pull("wrong", str(keys / "other.pem.pub"), KEY_A) is None
    assert "not by the expected key" in warnings(capsys)[0]
    # a signed record edited on the server, and one replayed under another key
    (tmp_path / "remote" / "ac" / KEY_C).write_text(json.dumps({**signed, "key": KEY_C}))
    tampered = {**signed, "outputs": {"m": {"sha256": "0" * 64, "size": 5}}}
    (tmp_path / "remote" / "ac" / KEY_A).write_text(json.dumps(tampered))
    assert pull("tamper", str(keys / "cache.pem.pub"), KEY_A) is None
    assert "does not match the signed bytes" in warnings(capsys)[0]
    assert pull("replay", str(keys / "cache.pem.pub"), KEY_C) is None
    assert "signature" in warnings(capsys)[0]
    store.flush_stats()
    assert remote.read_stats(tmp_path / "strict")["counts"]["rejected"] == 2


@pytest.mark.parametrize("name", ["../escape", "/abs/path", "a/../../b", "./x", ""])
def test_records_with_unsafe_output_names_are_refused(name):
    record = {"key": KEY_A, "stage": "s", "outputs": {name: {"sha256": "0" * 64, "size": 1}}}
    assert "not a plain relative path" in remote.record_problem(KEY_A, record)
    assert remote.record_problem(KEY_A, {**record, "outputs": {"d/ok.bin": {"sha256": "0" * 64,
                                                                            "size": 1}}}) is None
    assert "names key" in remote.record_problem(KEY_B, record)


def test_an_unusable_url_warns_once_and_builds_locally(tmp_path, capsys):
    # s3:// is a scheme fsspec serves, through s3fs, which this venv does not install
    store.configure(tmp_path, url="s3://bucket/cache", push=True)
    st = Store(tmp_path / ".store")
    assert st.lookup(KEY_A) is None and st.lookup(KEY_B) is None
    st.put(KEY_A, "demo", outputs_in(tmp_path / "o", **{"m": b"m"}))
    (line,) = warnings(capsys)
    assert "remote cache s3://bucket/cache: opening the cache failed" in line
    assert "building locally" in line


def test_a_url_whose_scheme_nothing_serves_is_refused_at_once(tmp_path):
    """a typo (htps://) or a scheme no fsspec file system knows is a wrong input, not a remote
    that is down: refused at configuration, before any step (a no-op build would never ask)."""
    for url in ("nosuchproto://host/cache", "htps://cache.example.org"):
        with pytest.raises(PipelineError, match=r"cache=.*no file system serves the scheme"):
            store.configure(tmp_path, url=url)


def test_configure_rejects_an_unreadable_key_at_once(tmp_path):
    with pytest.raises(PipelineError, match="cannot read the cache public key .*nowhere.pub"):
        store.configure(tmp_path, url="file:///x", pubkey=str(tmp_path / "nowhere.pub"))


def test_no_remote_imports_neither_fsspec_nor_cryptography_and_figures_merge(tmp_path):
    script = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from pipeline.core import store
root = Path({str(tmp_path)!r})
store.configure(root)
st = store.Store(root / ".store")
(root / "f").write_bytes(b"f")
st.restore(st.put("k" * 64, "s", {{"f": root / "f"}}), root / "into")
assert st.lookup("z" * 64) is None
print(sorted(m for m in ("fsspec", "aiohttp", "cryptography") if m in sys.modules))
import os
pid = os.fork()  # as doit -n does: a forked worker leaves with os._exit, its figures written
if pid == 0:
    st.lookup("k" * 64)
    os._exit(0)
os.waitpid(pid, 0)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    counts = remote.read_stats(tmp_path)["counts"]  # merged: the worker's, then at exit the parent's
    assert (counts["lookups"], counts["local_hits"], counts["stored"]) == (2, 1, 1), counts


def test_release_signing_keeps_its_names_from_the_core_primitives():
    assert signing.sign is core_signing.sign and signing.check is core_signing.check
    assert signing.load_private_key is core_signing.load_private_key
    assert (signing.ENV_KEY, signing.ENV_PUBKEY) == ("MODELYARD_SIGNING_KEY", "MODELYARD_VERIFY_KEY")


# ---- the cache commands ----------------------------------------------------------------------

def step_json(artifacts: Path, where: str, key: str) -> None:
    path = artifacts / where / "step.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "outputs": {}}))


def test_gc_keeps_what_the_current_outputs_name(tmp_path):
    art = tmp_path / "artifacts"
    st = Store(art / ".store")
    shared = b"s" * 1000
    st.put(KEY_A, "x", outputs_in(tmp_path / "a", **{"s": shared, "a": b"a" * 10}))
    st.put(KEY_B, "x", outputs_in(tmp_path / "b", **{"s": shared, "b": b"b" * 20}))
    st.put(KEY_C, "x", outputs_in(tmp_path / "c", **{"c": b"c" * 30}))
    with pytest.raises(PipelineError, match="no step.json under"):
        cache.gc(art)
    step_json(art, "models/m/import", KEY_A)
    text = cache.gc(art)
    assert "kept 1 key records" in text and "removed 2 records and 2 objects, 50 B" in text
    assert [p.stem for p in st.records()] == [KEY_A]
    assert len(st.objects()) == 2 and st.lookup(KEY_A) is not None


def test_gc_with_a_budget_removes_the_oldest_records_first(tmp_path):
    art = tmp_path / "artifacts"
    st = Store(art / ".store")
    for i, key in enumerate((KEY_A, KEY_B, KEY_C)):
        st.put(key, "x", outputs_in(tmp_path / key[0], **{"o": bytes([i]) * 1000}))
        os.utime(st.record_path(key), (1000 + i, 1000 + i))
    st.lookup(KEY_A)  # a restore makes a record new again
    text = cache.gc(art, budget="2.5K")
    assert sorted(p.stem for p in st.records()) == [KEY_A, KEY_C], text
    assert len(st.objects()) == 2
    with pytest.raises(PipelineError, match="budget='lots' is not a size"):
        cache.gc(art, budget="lots")
    assert cache.parse_size("2G") == 2 << 30 and cache.parse_size("100") == 100


def test_cache_push_uploads_the_local_store_and_needs_push_on(tmp_path):
    art = tmp_path / "artifacts"
    st = Store(art / ".store")
    st.put(KEY_A, "x", outputs_in(tmp_path / "a", **{"a": b"a" * 100}))
    st.put(KEY_B, "x", outputs_in(tmp_path / "b", **{"b": b"b" * 100}))
    with pytest.raises(PipelineError, match="no remote cache to push to"):
        cache.push(art)
    url = f"file://{tmp_path / 'remote'}"
    store.configure(art, url=url)
    with pytest.raises(PipelineError, match="pull-only by default"):
        cache.push(art)
    store.configure(art, url=url, push=True)
    text = cache.push(art)
    assert text.startswith(f"pushed 2 key records to {url}: 2 objects uploaded, 200 B"), text
    assert "pushed 2 key records" in cache.push(art) and "0 objects uploaded" in cache.push(art)
    assert sorted(p.name for p in (tmp_path / "remote" / "ac").iterdir()) == [KEY_A, KEY_B]
    assert remote.read_stats(art) is None  # the command is no build: no figures written
    with pytest.raises(PipelineError, match="doit cache status|push|gc|verify"):
        cache.command(art, ["sweep"])
    assert cache.command(art, ["status"]).startswith("local store")
