"""The remote cache against real servers: nginx with WebDAV PUT (Bazel's /ac + /cas layout) and
tiny socket servers that fail on purpose. Steps are run through the real step engine
(core/steps.py execute) with a toy stage, so no toolchain is needed and each test takes seconds.

Faults must never fail a build: a damaged object is discarded (the step runs), a server that
stops, stalls, answers 503 or drops the connection mid-body is warned about once and the build
goes on locally, with the same results.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cache_server import Nginx, SocketServer, http_response
from conftest import REPO
from pipeline.core import remote, store
from pipeline.core.layout import Layout
from pipeline.core.steps import StageConfig, Step, execute, step_key
from pipeline.core.store import Store
from pipeline.release import signing

RUNS: list[str] = []  # names of the toy steps whose action ran, in this process


@dataclass(frozen=True)
class ToyConfig(StageConfig):
    size: int = 200_000


def toy_action(ctx) -> None:
    """Deterministic outputs from the input: a 'model' and a small JSON."""
    RUNS.append(ctx.step.name)
    seed = hashlib.sha256(ctx.input("src").read_bytes()).digest()
    blocks = (ctx.cfg.size + 31) // 32
    data = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(blocks))
    ctx.output("model.bin").write_bytes(data[:ctx.cfg.size])
    ctx.output("info.json").write_text(json.dumps({"seed": seed.hex()}))


def toy_steps(artifacts: Path, sources: Path, n: int = 3) -> list[Step]:
    layout = Layout(artifacts)
    steps = []
    for i in range(n):
        src = sources / f"m{i}.txt"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"model {i}\n")
        steps.append(Step(stage="toy", name=f"m{i}", version=1, config=ToyConfig(),
                          inputs={"src": src}, outputs=("model.bin", "info.json"),
                          out_dir=layout.model_stage(f"m{i}", "toy"), tools=(), action=toy_action,
                          layout=layout, doc="a toy step"))
    return steps


def build(root: Path, n: int = 3, **cache) -> tuple[list[str], dict[str, bytes]]:
    """Run the toy steps in the workspace `root` with the cache configured as given:
    (how each step was brought up to date, every output's bytes)."""
    store.configure(root / "artifacts", **cache)
    steps = toy_steps(root / "artifacts", root / "src", n)
    hows = [execute(step) for step in steps]
    outputs = {f"{s.name}/{o}": (s.out_dir / o).read_bytes() for s in steps for o in s.outputs}
    return hows, outputs


def key_of(root: Path, i: int) -> str:
    step = toy_steps(root / "artifacts", root / "src")[i]
    return step_key(step.key_parts())


def cache_warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("modelyard: remote cache")]


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(store, "_remote", None)
    monkeypatch.setattr(store, "_stats", None)
    RUNS.clear()


@pytest.fixture
def nginx(tmp_path):
    server = Nginx(tmp_path / "nginx")
    yield server
    server.stop()


@pytest.fixture
def reference(tmp_path) -> dict[str, bytes]:
    """The outputs of a clean build with no cache at all."""
    hows, outputs = build(tmp_path / "clean")
    assert hows == ["ran"] * 3
    RUNS.clear()
    return outputs


@pytest.mark.parametrize("kind", ["http", "file"])
def test_a_fresh_workspace_restores_what_another_pushed(tmp_path, nginx, reference, kind):
    url = nginx.url if kind == "http" else f"file://{tmp_path / 'shared'}"
    served = (lambda k, n: nginx.served(k, n)) if kind == "http" else \
        (lambda k, n: tmp_path / "shared" / k / n)
    hows, outputs = build(tmp_path / "ci", url=url, push=True)
    assert hows == ["ran"] * 3 and outputs == reference
    record = json.loads(served("ac", key_of(tmp_path / "ci", 0)).read_text())
    for name, meta in record["outputs"].items():
        assert hashlib.sha256(served("cas", meta["sha256"]).read_bytes()).hexdigest() == meta["sha256"]
    RUNS.clear()
    hows, outputs = build(tmp_path / "laptop", url=url)  # pull-only
    assert hows == ["restored"] * 3 and RUNS == [] and outputs == reference
    store.flush_stats()
    counts = remote.read_stats(tmp_path / "laptop" / "artifacts")["counts"]
    assert (counts["remote_hits"], counts["objects_pulled"]) == (3, 6)
    assert counts["bytes_pulled"] == sum(len(v) for v in reference.values())
    assert counts["objects_pushed"] == counts["records_pushed"] == 0
    if kind == "http":  # pull-only sent no PUT; the pusher sent objects, then records
        log = (nginx.root / "access.log").read_text().splitlines()
        puts = [line.split('"')[1].split()[1].split("/")[2] for line in log if '"PUT ' in line]
        assert puts == ["cas", "cas", "ac"] * 3, puts
    else:
        assert not list((tmp_path / "shared").rglob(".*.tmp"))


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_object_on_the_server_is_discarded_and_the_step_runs(tmp_path, nginx, reference,
                                                                       capsys, damage):
    build(tmp_path / "ci", url=nginx.url, push=True)
    key = key_of(tmp_path / "ci", 1)
    digest = json.loads(nginx.served("ac", key).read_text())["outputs"]["model.bin"]["sha256"]
    obj = nginx.served("cas", digest)
    data = bytearray(obj.read_bytes())
    if damage == "flipped":
        data[1000] ^= 0x01
    else:
        del data[len(data) // 2:]
    obj.write_bytes(bytes(data))
    capsys.readouterr()
    RUNS.clear()
    hows, outputs = build(tmp_path / "b", url=nginx.url, push=True)
    assert hows == ["restored", "ran", "restored"] and RUNS == ["m1"]
    assert outputs == reference
    (line,) = cache_warnings(capsys)
    assert f"discarding the damaged object cas/{digest}" in line, line
    assert hashlib.sha256(obj.read_bytes()).hexdigest() == digest  # the pusher repaired it
    store.flush_stats()
    counts = remote.read_stats(tmp_path / "b" / "artifacts")["counts"]
    assert (counts["damaged"], counts["remote_hits"], counts["objects_pushed"]) == (1, 2, 1)


def test_a_server_stopped_mid_build_warns_once_and_results_are_identical(tmp_path, nginx,
                                                                          reference, capsys):
    build(tmp_path / "ci", url=nginx.url, push=True)
    capsys.readouterr()
    RUNS.clear()
    store.configure(tmp_path / "b" / "artifacts", url=nginx.url, push=True, timeout=2)
    steps = toy_steps(tmp_path / "b" / "artifacts", tmp_path / "b" / "src")
    hows = [execute(steps[0])]
    nginx.stop()
    started = time.monotonic()
    hows += [execute(step) for step in steps[1:]]
    assert time.monotonic() - started < 5
    assert hows == ["restored", "ran", "ran"]
    outputs = {f"{s.name}/{o}": (s.out_dir / o).read_bytes() for s in steps for o in s.outputs}
    assert outputs == reference
    (line,) = cache_warnings(capsys)
    assert line.startswith(f"modelyard: remote cache {nginx.url}: reading a key record failed")
    assert "building locally" in line
    store.flush_stats()
    assert remote.read_stats(tmp_path / "b" / "artifacts")["faults"] == [line[len("modelyard: "):]]


def record_for(key: str, size: int, body: bytes) -> bytes:
    outputs = {"model.bin": {"sha256": hashlib.sha256(body).hexdigest(), "size": size}}
    return json.dumps(remote.record_payload(key, "toy", outputs)).encode()


def test_a_connection_dropped_mid_object_is_a_fault(tmp_path, capsys):
    body = bytes(range(256)) * 400
    key = "d" * 64

    def respond(method, path):
        if path.endswith(f"/ac/{key}"):
            return http_response("200 OK", record_for(key, len(body), body))
        if "/cas/" in path:  # claims the whole object, sends a third, hangs up
            return http_response("200 OK", body[:len(body) // 3], length=len(body))
        return http_response("404 Not Found", b"")

    server = SocketServer(respond)
    try:
        store.configure(tmp_path, url=server.url, timeout=2)
        st = Store(tmp_path / ".store")
        assert st.lookup(key) is None
        assert st.lookup("e" * 64) is None  # the remote is off now: no request
    finally:
        server.stop()
    assert len(server.requests) == 2, server.requests
    (line,) = cache_warnings(capsys)
    assert f"downloading cas/{hashlib.sha256(body).hexdigest()} failed" in line, line
    assert "building locally" in line
    assert list((tmp_path / ".store").rglob("*.tmp")) == []


def test_a_server_that_never_answers_times_out(tmp_path, capsys):
    server = SocketServer(lambda method, path: None)
    try:
        store.configure(tmp_path, url=server.url, push=True, timeout=1)
        st = Store(tmp_path / ".store")
        started = time.monotonic()
        assert st.lookup("a" * 64) is None
        src = tmp_path / "o.bin"
        src.write_bytes(b"o" * 1000)
        st.put("a" * 64, "toy", {"o.bin": src})  # pushing: the remote is already off
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    # bounded: the server never answers, so only the 1 s timeout can end the wait (a generous
    # ceiling: this is about a bound existing, not about speed on a loaded machine)
    assert elapsed < 30, elapsed
    assert len(server.requests) == 1, server.requests  # then the remote was off
    (line,) = cache_warnings(capsys)
    assert "no answer within the 1 s timeout" in line or "time bound" in line, line
    assert st.lookup("a" * 64) is not None  # the local store works as ever


def test_a_server_that_trickles_hits_the_bound_on_the_whole_transfer(tmp_path, capsys):
    """Each read comes within `timeout`, but the object as a whole takes far longer than
    timeout + size / MIN_RATE: the transfer is cut at that bound."""
    body = bytes(range(256)) * 400
    key = "d" * 64

    def respond(method, path):
        if path.endswith(f"/ac/{key}"):
            return http_response("200 OK", record_for(key, len(body), body))
        answer = http_response("200 OK", body)
        return [answer[i:i + 1024] for i in range(0, len(answer), 1024)]  # 40 s: 101 pieces

    server = SocketServer(respond, trickle_s=0.4)
    try:
        store.configure(tmp_path, url=server.url, timeout=1)
        started = time.monotonic()
        assert Store(tmp_path / ".store").lookup(key) is None
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    # the bound: 1 s connect + 1 s + 100 KiB at 1 MiB/s = 2.1 s, against 40 s for the whole body
    # (the ceiling is generous: a loaded machine is slower, never faster, than the bound)
    assert 1.9 < elapsed < 25, elapsed
    (line,) = cache_warnings(capsys)
    assert "failed (the transfer took longer than its time bound)" in line, line


def test_5xx_answers_are_faults(tmp_path, capsys):
    server = SocketServer(lambda method, path: http_response("503 Service Unavailable", b"busy"))
    try:
        store.configure(tmp_path, url=server.url)
        assert Store(tmp_path / ".store").lookup("a" * 64) is None
    finally:
        server.stop()
    (line,) = cache_warnings(capsys)
    assert "reading a key record failed (HTTP 503 Service Unavailable)" in line


def test_a_refused_push_turns_pushing_off_and_pulling_goes_on(tmp_path, capsys):
    server = SocketServer(lambda method, path: http_response(
        "403 Forbidden" if method == "PUT" else "404 Not Found", b""))
    try:
        store.configure(tmp_path, url=server.url, push=True)
        st = Store(tmp_path / ".store")
        src = tmp_path / "o.bin"
        src.write_bytes(b"o" * 1000)
        st.put("a" * 64, "toy", {"o.bin": src})
        st.put("b" * 64, "toy", {"o.bin": src})
        assert st.lookup("c" * 64) is None
    finally:
        server.stop()
    methods = [line.split()[0] for line in server.requests]
    assert methods.count("PUT") == 1 and methods[-1] == "GET", server.requests  # still pulling
    (line,) = cache_warnings(capsys)
    assert "uploading cas/" in line and "HTTP 403 Forbidden" in line, line
    assert "pushing is off for the rest of this run (pulling goes on)" in line


PUSH_SCRIPT = """
import sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from pipeline.core import store
root = Path(sys.argv[1])
store.configure(root, url={url!r}, push=True)
while time.time() < {start}:
    time.sleep(0.001)
out = store.Store(root / ".store").put({key!r}, "toy", {{"model.bin": Path({src!r})}})
print(out["model.bin"]["sha256"])
"""


@pytest.mark.parametrize("kind", ["http", "file"])
def test_two_runners_pushing_the_same_key_at_once(tmp_path, nginx, capsys, kind):
    url = nginx.url if kind == "http" else f"file://{tmp_path / 'shared'}"
    src = tmp_path / "model.bin"
    src.write_bytes(hashlib.sha256(b"seed").digest() * (8 << 15))  # 8 MiB
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    key = "f" * 64
    script = PUSH_SCRIPT.format(repo=str(REPO), url=url, start=time.time() + 1.5, key=key,
                                src=str(src))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"runner{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0 and out.strip() == digest and "modelyard:" not in err, err
    served = nginx.served if kind == "http" else (lambda k, n: tmp_path / "shared" / k / n)
    assert hashlib.sha256(served("cas", digest).read_bytes()).hexdigest() == digest
    assert json.loads(served("ac", key).read_text())["outputs"]["model.bin"]["sha256"] == digest
    store.configure(tmp_path / "reader", url=url)
    st = Store(tmp_path / "reader" / ".store")
    st.restore(st.lookup(key), tmp_path / "restored")
    assert (tmp_path / "restored" / "model.bin").read_bytes() == src.read_bytes()


def test_signed_records_over_http(tmp_path, nginx, reference, capsys):
    keys = tmp_path / "keys"
    signing.generate(keys / "cache.pem")
    signing.generate(keys / "intruder.pem")
    build(tmp_path / "trusted", url=nginx.url, push=True, signing_key=str(keys / "cache.pem"))
    # an intruder with write access replaces one record's outputs and signs it with its own key
    path = nginx.served("ac", key_of(tmp_path / "trusted", 0))
    record = json.loads(path.read_text())
    record["outputs"]["model.bin"] = record["outputs"]["info.json"]
    record["signature"] = signing.sign(signing.load_private_key(str(keys / "intruder.pem")),
                                       remote.signed_bytes(record))
    path.write_text(json.dumps(record))
    capsys.readouterr()
    RUNS.clear()
    hows, outputs = build(tmp_path / "ci", url=nginx.url, pubkey=str(keys / "cache.pem.pub"))
    assert hows == ["ran", "restored", "restored"] and outputs == reference
    (line,) = cache_warnings(capsys)
    assert "ignoring key records not signed by the cache public key" in line
    assert "not by the expected key" in line
    store.flush_stats()
    assert remote.read_stats(tmp_path / "ci" / "artifacts")["counts"]["rejected"] == 1


# --- the real pipeline, through doit -------------------------------------------------------------

def test_a_fresh_clone_builds_from_the_remote_without_running_a_tool_and_can_revalidate(tmp_path, nginx):
    """A trusted runner builds a tiny model for host and pushes; a fresh folder pointed at the
    same nginx restores every step (no tool log is written) and gets the same bytes;
    revalidate=1 then runs the validate steps here, and only those, with the same results."""
    from conftest import Workspace, add_tiny_model, ran

    def tree(ws):
        return {p.relative_to(ws.artifacts).as_posix(): p.read_bytes() for p in ws.artifacts.rglob("*")
                if p.is_file() and p.relative_to(ws.artifacts).parts[0] not in
                {".doit.db", ".cache", "logs", ".tmp", ".lock", ".store"}}

    ci, fresh = Workspace(tmp_path / "ci"), Workspace(tmp_path / "fresh")
    for ws in (ci, fresh):
        add_tiny_model(ws.models, "alpha", seed=3)
    pushed = ci.build("target=host", f"cache={nginx.url}", "cache_push=1")
    assert "validate:host/alpha/cpu-x86_64" in ran(pushed)

    pulled = fresh.build("target=host", f"cache={nginx.url}")
    assert not (fresh.artifacts / "logs").exists() or not list((fresh.artifacts / "logs").rglob("*.log"))
    assert tree(fresh) == tree(ci)
    counts = remote.read_stats(fresh.artifacts)["counts"]
    assert counts["remote_hits"] == counts["lookups"] == len(ran(pulled)) and counts["stored"] == 0
    status = fresh.doit("cache", "status", f"cache={nginx.url}")
    assert status.returncode == 0 and "pull-only" in status.stdout, status.stdout + status.stderr

    again = fresh.build("target=host", f"cache={nginx.url}", "revalidate=1")
    assert [t for t in ran(again) if not t.startswith(("validate:", "manifest:", "choose:"))] == []
    assert {"validate:host/alpha/cpu-x86_64", "validate:host/alpha/cpu-x86_64-tvm"} <= set(ran(again))
    logs = sorted(p.parent.name for p in (fresh.artifacts / "logs").rglob("*.log"))
    assert logs and set(logs) == {"validate"}, logs
    assert tree(fresh) == tree(ci)
