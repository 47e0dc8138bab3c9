"""The board-side C runtime (runtime/, stage `runtime`): built by the graph, shipped in the release,
checked as shipped: x86_64 natively, aarch64 under qemu-user, IREE and TVM artifacts.

One module-scoped workspace: a tiny model built for host and rk3588 (CPU ABIs only, no compiler
choice slot, so that both the IREE and the TVM artifact ship), released for both targets (which
builds the runtime once per architecture). A second x86_64 build in another folder proves the
build reproducible.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO, Workspace, add_tiny_model, require, require_aarch64, sha256, write_spec
from pipeline.run import vulkan

QEMU = ["qemu-aarch64-static", "-L", "/usr/aarch64-linux-gnu", "-cpu", "cortex-a76"]
# The suite's workspaces that release take the runtime step through this remote cache (file://):
# the first builds and pushes it, the others (other workspaces, other xdist workers, waiting on
# the lock meanwhile) restore the same key. test_two_builds_give_identical_bytes builds without it.
RUNTIME_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / f"modelyard-tests-runtime-cache-{os.getuid()}"


def shared_runtime(ws: Workspace, target: str, targets: Path) -> None:
    """`doit runtime target=T` in ws through the suite's runtime cache (built once per key)."""
    RUNTIME_CACHE.mkdir(exist_ok=True)
    with open(RUNTIME_CACHE / f"{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        r = ws.doit("runtime", f"target={target}", f"targets={targets}",
                    f"cache=file://{RUNTIME_CACHE}", "cache_push=1")
    assert r.returncode == 0, r.stdout + r.stderr


def registry(folder: Path) -> Path:
    """host and rk3588 with their CPU ABIs only (no GPU, no NPU) and no compiler-choice slot (every
    CPU ABI ships); host also with rk3588's Vulkan baseline ABI first in its fallback order
    (validated on lavapipe, as the C runtime runs it there)."""
    folder.mkdir(parents=True)
    rk3588 = yaml.safe_load((REPO / "pipeline/targets/rk3588.yaml").read_text())
    for name in ("host", "rk3588"):
        doc = yaml.safe_load((REPO / "pipeline/targets" / f"{name}.yaml").read_text())
        doc["abis"] = {k: v for k, v in doc["abis"].items() if v.get("arch")}  # the CPU ABIs
        doc["fallback"] = [a for a in doc.get("fallback", doc["abis"]) if a in doc["abis"]]
        if name == "host":
            doc["abis"] = {"vulkan-baseline": rk3588["abis"]["vulkan-baseline"], **doc["abis"]}
            doc["fallback"] = ["vulkan-baseline", *doc["fallback"]]
        doc.pop("ship", None)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def add_uint8_model(models: Path, name: str) -> None:
    """x f32[1,16] -> x * 20 -> QuantizeLinear(scale 1, zero point 128) -> y uint8[1,16]: an
    output IREE returns as signless i8 (the same bytes), declared uint8 in the release. IREE
    builds only (TVM returns uint8 as uint8)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    folder = models / name
    folder.mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["m"]),
         helper.make_node("QuantizeLinear", ["m", "scale", "zero"], ["y"])], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 16])],
        initializer=[numpy_helper.from_array(np.array(20, np.float32), "k"),
                     numpy_helper.from_array(np.array(1, np.float32), "scale"),
                     numpy_helper.from_array(np.array(128, np.uint8), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (folder / "model.onnx").write_bytes(model.SerializeToString(deterministic=True))
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"), inputs={"x": ([1, 16], "float32", 0)},
               extra="skip:\n  'vulkan-*': 'no 8-bit storage on the baseline target (and CI time)'\n"
                     "  '*-tvm': 'signless integers are an IREE matter (and CI time)'\n")


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict:
    require(shutil.which("qemu-aarch64-static") is not None, "qemu-user-static is missing (setup.sh)")
    require_aarch64()
    root = tmp_path_factory.mktemp("c_runtime")
    ws = Workspace(root / "ws")
    add_tiny_model(ws.models, "alpha", seed=3)
    add_uint8_model(ws.models, "beta")
    targets = registry(root / "targets")
    key = root / "key.pem"
    assert ws.doit("keygen", f"key={key}").returncode == 0
    out = {"ws": ws, "key": key, "targets": targets}
    for target in ("host", "rk3588"):
        shared_runtime(ws, target, targets)
        result = ws.doit("release", f"target={target}", "version=1.0.0", f"key={key}", f"targets={targets}")
        assert result.returncode == 0, result.stdout + result.stderr
        out[target] = ws.artifacts / "releases" / target / "1.0.0"
    return out


def cli(release: Path, arch: str, *args: str, cwd: Path | None = None,
        exe_from: Path | None = None) -> subprocess.CompletedProcess:
    """modelyard-run of `arch` from the release `exe_from` (default: the release it opens)."""
    exe = (exe_from or release) / "runtime" / arch / "bin" / "modelyard-run"
    argv = ([*QEMU, str(exe)] if arch == "aarch64" else [str(exe)]) + [str(release), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd)


def abis(release: Path, model: str = "alpha") -> dict:
    return json.loads((release / "release.json").read_text())["models"][model]["artifacts"]


# ----------------------------------------------------------------------------- as shipped
def test_bundle_layout_sbom_and_verify(releases):
    rel = releases["rk3588"]
    doc = json.loads((rel / "release.json").read_text())
    for name in ("lib/libmodelyard.so", "lib/libmodelyard_tvm.so", "lib/libtvm_runtime.so",
                 "lib/libtvm_ffi.so", "lib/pkgconfig/modelyard.pc", "lib/cmake/modelyard/modelyardConfig.cmake",
                 "bin/modelyard-run"):
        assert (rel / "runtime" / "aarch64" / name).is_file(), name
    assert (rel / "runtime/include/modelyard.h").is_file()
    assert {"iree-LICENSE", "flatcc-LICENSE", "cjson-LICENSE", "vulkan-headers-LICENSE.md",
            "apache-tvm-LICENSE"} <= {p.name for p in (rel / "runtime/licenses").iterdir()}
    assert doc["runtime"]["aarch64"]["iree"]["commit"] == "b48a5955575cf8924ffc191f3b0804976e5738b9"
    assert doc["models"]["alpha"]["test_vectors"]["inputs"] == ["tests/alpha/input_0.npy"]
    elf = (rel / "runtime/aarch64/lib/libmodelyard.so").read_bytes()
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
    sbom = json.loads((rel / "sbom.cdx.json").read_text())
    by_name = {c["name"]: c for c in sbom["components"]}
    lib = by_name["runtime/aarch64/lib/libmodelyard.so"]
    assert lib["hashes"][0]["content"] == hashlib_sha256(rel / "runtime/aarch64/lib/libmodelyard.so")
    static = by_name["runtime/aarch64/lib/libmodelyard.a"]  # it links IREE and cJSON in too
    assert static["hashes"][0]["content"] == hashlib_sha256(rel / "runtime/aarch64/lib/libmodelyard.a")
    assert "b48a5955575cf8924ffc191f3b0804976e5738b9" in by_name["iree-runtime"]["purl"]
    manifest = json.loads((rel / "manifest.json").read_text())["files"]
    assert "runtime/aarch64/bin/modelyard-run" in manifest and "tests/alpha/output_0.npy" in manifest
    ws = releases["ws"]
    ok = ws.doit("verify", f"bundle={rel}", f"pubkey={releases['key']}.pub")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    with tarfile.open(rel / "modelyard-rk3588-1.0.0.tar.gz") as tar:
        mode = tar.getmember("modelyard-rk3588-1.0.0/runtime/aarch64/bin/modelyard-run").mode
    assert mode == 0o755


def test_board_flow_verify_unpack_run_with_no_chmod(releases, tmp_path):
    """The documented board flow as a firmware engineer runs it: `doit verify bundle=<archive>
    pubkey=... into=DIR`, then the unpacked modelyard-run --check on the unpacked release as it
    was unpacked (no chmod): natively for the host bundle, under qemu-aarch64-static for
    rk3588's. The program is 0755 and every other file 0644, in the unpacked folder as in the
    release folder; an archive released with every member 0644 still verifies (and unpacks so)."""
    ws, pub = releases["ws"], f"{releases['key']}.pub"
    for target, arch in (("host", "x86_64"), ("rk3588", "aarch64")):
        rel, root = releases[target], f"modelyard-{target}-1.0.0"
        r = ws.doit("verify", f"bundle={rel / f'{root}.tar.gz'}", f"pubkey={pub}",
                    f"into={tmp_path / target}")
        assert r.returncode == 0 and f"unpacked into {tmp_path / target / root}" in r.stdout, \
            r.stdout + r.stderr
        unpacked = tmp_path / target / root
        exe = json.loads((unpacked / "release.json").read_text())["runtime"][arch]["bin"]
        modes = {p.relative_to(unpacked).as_posix(): p.stat().st_mode & 0o7777
                 for p in unpacked.rglob("*") if p.is_file()}
        programs = {n for n in modes if n.startswith(f"runtime/{arch}/bin/")}  # and the example
        assert exe in programs and {n: m for n, m in modes.items() if m != 0o644} == \
            {n: 0o755 for n in programs}
        assert {n: rel.joinpath(n).stat().st_mode & 0o7777 for n in modes} == modes  # the folder
        r = cli(unpacked, arch, "alpha", "--check", "--abi", f"cpu-{arch}")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith(f"chose cpu-{arch} ") and "PASS" in r.stdout and "FAIL" not in r.stdout

    # released before modes were kept: every member 0644; it verifies, and unpacks as it says
    old = tmp_path / "old.tar.gz"
    with tarfile.open(releases["host"] / "modelyard-host-1.0.0.tar.gz") as src, \
            tarfile.open(old, "w:gz") as tar:
        for member in src:
            data = src.extractfile(member)
            member.mode = 0o644
            tar.addfile(member, data)
    r = ws.doit("verify", f"bundle={old}", f"pubkey={pub}", f"into={tmp_path / 'old'}")
    assert r.returncode == 0 and "signed by the expected key" in r.stdout, r.stdout + r.stderr
    exe = tmp_path / "old/modelyard-host-1.0.0/runtime/x86_64/bin/modelyard-run"
    assert exe.stat().st_mode & 0o7777 == 0o644


def hashlib_sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_x86_64_check_every_cpu_artifact(releases):
    rel = releases["host"]
    assert set(abis(rel)) == {"vulkan-baseline", "cpu-x86_64", "cpu-x86_64-tvm"}
    assert set(abis(rel, "beta")) == {"cpu-x86_64"}
    for model in ("alpha", "beta"):
        for abi in [a for a in abis(rel, model) if a.startswith("cpu-")]:
            r = cli(rel, "x86_64", model, "--check", "--abi", abi)
            assert r.returncode == 0, r.stdout + r.stderr
            assert f"chose {abi}" in r.stdout and "PASS" in r.stdout and "FAIL" not in r.stdout
    # beta's uint8 output: IREE returns signless i8 (the same bytes), read as the declared uint8
    r = cli(rel, "x86_64", "beta", "--check", "--abi", "cpu-x86_64")
    assert "output y uint8 [1, 16]" in r.stdout and "check y: uint8, max 0 steps off (tol 0) PASS" in r.stdout


def test_aarch64_check_every_cpu_artifact_under_qemu(releases):
    rel = releases["rk3588"]
    assert set(abis(rel)) == {"cpu-aarch64", "cpu-aarch64-tvm"} and set(abis(rel, "beta")) == {"cpu-aarch64"}
    for model in ("alpha", "beta"):
        for abi in abis(rel, model):
            r = cli(rel, "aarch64", model, "--check", "--abi", abi)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "aarch64 CPU" in r.stdout and "PASS" in r.stdout and "FAIL" not in r.stdout
    r = cli(rel, "aarch64", "alpha")  # no --abi: the fallback order's first
    assert r.returncode == 0 and r.stdout.startswith("chose cpu-aarch64 "), r.stdout + r.stderr


# ----------------------------------------------------------------------------- Vulkan
def lavapipe() -> dict:
    """The environment that makes Mesa's lavapipe the only Vulkan driver, as the Python side
    selects it (VK_DRIVER_FILES / VK_ICD_FILENAMES), with the suite's Mesa shader cache."""
    return vulkan.driver_env("lavapipe", shader_cache=Path(os.environ["MODELYARD_SHADER_CACHE"]))


def cli_env(release: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    exe = release / "runtime" / "x86_64" / "bin" / "modelyard-run"
    return subprocess.run([str(exe), str(release), *args], capture_output=True, text=True,
                          timeout=600, env=env)


def test_vulkan_baseline_checks_on_lavapipe(releases):
    """The host release's Vulkan baseline artifact, first in its fallback order, on lavapipe: chosen
    only when a software rasterizer is allowed, and within its recorded tolerance there."""
    rel = releases["host"]
    require(vulkan.icd_file("lavapipe") is not None, "mesa-vulkan-drivers missing (setup.sh)")
    env = lavapipe()
    r = cli_env(rel, "alpha", "--check", "--allow-software-vulkan", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.match(r"chose vulkan-baseline \(models/alpha/vulkan-baseline/model.vmfb\) on Vulkan "
                    r"device llvmpipe .*\(Vulkan 1\.\d+\.\d+, cpu, driver llvmpipe\) \(IREE vulkan\)\n", r.stdout), r.stdout
    assert "check y: max_abs" in r.stdout and "PASS" in r.stdout and "FAIL" not in r.stdout
    r = cli_env(rel, "alpha", "--check", env=env)  # not asked: the CPU artifact, and why
    assert r.returncode == 0 and r.stdout.startswith("chose cpu-x86_64 "), r.stdout + r.stderr
    assert "passed over vulkan-baseline: the only Vulkan device is llvmpipe" in r.stdout
    assert "a software rasterizer, not a GPU" in r.stdout


def test_vulkan_requirements_the_device_does_not_meet(releases, tmp_path):
    """The artifact's recorded requirements as a Mali-G610 (valhall3) build records them: lavapipe
    (subgroup size 8) is passed over with the reason, and forcing it is INCOMPATIBLE."""
    rel = shutil.copytree(releases["host"], tmp_path / "rel")
    require(vulkan.icd_file("lavapipe") is not None, "mesa-vulkan-drivers missing (setup.sh)")
    doc = json.loads((rel / "release.json").read_text())
    doc["models"]["alpha"]["artifacts"]["vulkan-baseline"]["requires"]["vulkan"].update(
        device_features=["shaderFloat16", "shaderInt8", "storageBuffer16BitAccess", "shaderBFloat16Type"],
        spirv_version="1.6", subgroup_operations=["shuffle", "arithmetic"], subgroup_size=[16],
        vulkan_api="1.4", max_workgroup_invocations=512, max_workgroup_memory_bytes=1 << 20)
    (rel / "release.json").chmod(0o644)
    (rel / "release.json").write_text(json.dumps(doc))
    env = lavapipe()
    r = cli_env(rel, "alpha", "--allow-software-vulkan", env=env)
    assert r.returncode == 0 and r.stdout.startswith("chose cpu-x86_64 "), r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("  passed over vulkan-baseline: "))
    for why in ("llvmpipe", "needs Vulkan 1.4 (SPIR-V 1.6), device has 1.3",
                "needs shaderBFloat16Type (a feature this runtime cannot query)",
                "compiled for subgroup size [16], device offers 8..8 (it would run and return wrong numbers)",
                "needs 1048576 bytes of workgroup memory"):
        assert why in line, line
    assert "needs shaderFloat16" not in line and "needs shaderInt8" not in line  # lavapipe has them
    r = cli_env(rel, "alpha", "--abi", "vulkan-baseline", "--allow-software-vulkan", env=env)
    assert r.returncode == 3 and "error INCOMPATIBLE: artifact vulkan-baseline cannot run here: llvmpipe" in r.stderr


def test_rknn_artifact_is_passed_over(releases, tmp_path):
    """An NPU artifact (format rknn) in the fallback order: passed over with the reason, forced: UNAVAILABLE."""
    rel = shutil.copytree(releases["host"], tmp_path / "rel")
    doc = json.loads((rel / "release.json").read_text())
    doc["models"]["alpha"]["artifacts"]["npu-rk3588"] = {
        "file": "models/alpha/npu-rk3588/model.rknn", "sha256": "0" * 64, "format": "rknn",
        "entry": "main", "requires": {
            "npu": {"target_platform": "rk3588", "librknnrt": "2.5.0"}, "device": "NPU", "backend": "npu"}}
    doc["target"]["fallback"].insert(0, "npu-rk3588")
    (rel / "release.json").chmod(0o644)
    (rel / "release.json").write_text(json.dumps(doc))
    r = cli(rel, "x86_64", "alpha")
    assert r.returncode == 0 and r.stdout.startswith("chose cpu-x86_64 "), r.stdout + r.stderr
    assert "  passed over npu-rk3588: this runtime has no RKNN backend; librknnrt 2.5.0 (Rockchip's " \
           "NPU runtime) runs .rknn models on the rk3588 NPU" in r.stdout
    r = cli(rel, "x86_64", "alpha", "--abi", "npu-rk3588")
    assert r.returncode == 3 and "error UNAVAILABLE: artifact npu-rk3588 cannot run here: this runtime " \
        "has no RKNN backend" in r.stderr, r.stderr


def test_check_fails_outside_the_tolerance(releases, tmp_path):
    rel = shutil.copytree(releases["host"], tmp_path / "rel")
    golden = rel / "tests/alpha/output_0.npy"
    data = np.load(golden)
    golden.chmod(0o644)
    np.save(golden, data + 0.5)
    r = cli(rel, "x86_64", "alpha", "--check", "--abi", "cpu-x86_64")
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr


def test_bench_separates_invoke_from_copies(releases):
    r = cli(releases["host"], "x86_64", "alpha", "--bench", "20", "--abi", "cpu-x86_64")
    assert r.returncode == 0, r.stderr
    for line in ("per call", "invoke (inside the runtime)", "boundary copies", "peak memory"):
        assert line in r.stdout
    p50 = [float(x) for x in re.findall(r"p50 ([0-9.]+) ms", r.stdout)]
    assert len(p50) == 3 and p50[1] <= p50[0]


# ----------------------------------------------------------------------------- clear errors
def test_errors_are_statuses_with_messages(releases, tmp_path):
    rel = shutil.copytree(releases["host"], tmp_path / "rel")
    vmfb = rel / abis(rel)["cpu-x86_64"]["file"]
    r = cli(rel, "x86_64", "nope")
    assert r.returncode == 3 and "NOT_FOUND" in r.stderr and "no model nope" in r.stderr and "alpha" in r.stderr
    r = cli(rel, "x86_64", "alpha", "--abi", "cpu-riscv")
    assert r.returncode == 3 and "no artifact cpu-riscv" in r.stderr
    # an artifact for another device: the rk3588 release on this x86_64 machine
    r = cli(releases["rk3588"], "x86_64", "alpha", exe_from=releases["host"])
    assert r.returncode == 3 and "INCOMPATIBLE" in r.stderr, r.stderr
    assert "built for aarch64, this machine is x86_64" in r.stderr
    # a tampered artifact: one byte flipped
    vmfb.chmod(0o644)
    data = bytearray(vmfb.read_bytes())
    data[len(data) // 2] ^= 1
    vmfb.write_bytes(bytes(data))
    r = cli(rel, "x86_64", "alpha", "--abi", "cpu-x86_64")
    assert r.returncode == 3 and "CORRUPT" in r.stderr and "tampered" in r.stderr, r.stderr
    # a missing file
    vmfb.unlink()
    r = cli(rel, "x86_64", "alpha", "--abi", "cpu-x86_64")
    assert r.returncode == 3 and "NOT_FOUND" in r.stderr and "cannot read" in r.stderr, r.stderr


class Info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("dtype_name", ctypes.c_char_p),
                ("rank", ctypes.c_int), ("shape", ctypes.c_int64 * 8), ("byte_size", ctypes.c_size_t)]


class Options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("abi", ctypes.c_char_p),
                ("allow_software_vulkan", ctypes.c_int), ("cpu_threads", ctypes.c_int),
                ("verify_sha256", ctypes.c_int)]


def library(release: Path):
    lib = ctypes.CDLL(str(release / "runtime/x86_64/lib/libmodelyard.so"))
    lib.modelyard_last_error.restype = ctypes.c_char_p
    lib.modelyard_explain.restype = ctypes.c_char_p
    lib.modelyard_iree_commit.restype = ctypes.c_char_p
    lib.modelyard_version.restype = ctypes.c_char_p
    return lib


def open_model(lib, release: Path, abi: str):
    model = ctypes.c_void_p()
    opts = Options()
    assert lib.modelyard_options_init(ctypes.byref(opts), ctypes.c_size_t(ctypes.sizeof(opts))) == 0
    opts.abi = abi.encode()
    status = lib.modelyard_open(str(release).encode(), b"alpha", ctypes.byref(opts), ctypes.byref(model))
    assert status == 0, lib.modelyard_last_error()
    return model


def run_c(lib, model, x: np.ndarray) -> np.ndarray:
    out = Info()
    assert lib.modelyard_output_info(model, ctypes.c_size_t(0), ctypes.byref(out)) == 0
    x = np.ascontiguousarray(x)
    assert lib.modelyard_set_input(model, ctypes.c_size_t(0), x.ctypes.data_as(ctypes.c_void_p),
                                   ctypes.c_size_t(x.nbytes)) == 0, lib.modelyard_last_error()
    assert lib.modelyard_run(model) == 0, lib.modelyard_last_error()
    y = np.empty(tuple(out.shape[:out.rank]), np.float32)
    assert lib.modelyard_get_output(model, ctypes.c_size_t(0), y.ctypes.data_as(ctypes.c_void_p),
                                    ctypes.c_size_t(y.nbytes)) == 0
    return y


def test_wrong_input_size_is_a_clear_status(releases):
    rel = releases["host"]
    lib = library(rel)
    for abi in ("cpu-x86_64", "cpu-x86_64-tvm"):
        model = open_model(lib, rel, abi)
        buf = np.zeros(10, np.float32)
        status = lib.modelyard_set_input(model, ctypes.c_size_t(0), buf.ctypes.data_as(ctypes.c_void_p),
                                         ctypes.c_size_t(buf.nbytes))
        assert status == 1  # MODELYARD_INVALID_ARGUMENT
        assert b"got 40 bytes, expected 3072 (float32, 768 elements)" in lib.modelyard_last_error()
        assert lib.modelyard_set_input(model, ctypes.c_size_t(5), buf.ctypes.data_as(ctypes.c_void_p),
                                       ctypes.c_size_t(40)) == 1
        assert b"the model has 1 inputs" in lib.modelyard_last_error()
        lib.modelyard_close(model)


# ----------------------------------------------------------------------------- IREE: pinned and proven
def test_hal_version_gate_and_vendored_equals_wheel(releases):
    """A .vmfb imports `hal` at some version; the vendored runtime must provide at least it, and
    compute exactly what the wheel's runtime (the compiler's version) computes."""
    import iree.runtime as ireert
    rel = releases["host"]
    vmfb = rel / abis(rel)["cpu-x86_64"]["file"]
    dump = subprocess.run([str(Path(ireert.__file__).parent.parent / "_runtime_libs" / "iree-dump-module"),
                           str(vmfb)], capture_output=True, text=True, check=True).stdout
    needed = re.search(r"\bhal\b.*?version\s*>=\s*(\d+)", dump, re.S)
    assert needed, dump[:2000]
    lib = library(rel)
    built = json.loads((rel / "release.json").read_text())["runtime"]["x86_64"]["iree"]
    assert lib.modelyard_iree_hal_version() == built["hal_module_version"]
    assert int(needed[1]) <= lib.modelyard_iree_hal_version(), (needed[0], built)
    assert lib.modelyard_iree_commit().decode() == built["commit"]
    x = np.load(rel / "tests/alpha/input_0.npy")
    model = open_model(lib, rel, "cpu-x86_64")
    ours = run_c(lib, model, x)
    lib.modelyard_close(model)
    wheel = ireert.load_vm_flatbuffer_file(str(vmfb), driver="local-task")
    theirs = np.asarray(wheel[abis(rel)["cpu-x86_64"]["entry"]](x))
    assert ours.tobytes() == theirs.tobytes()  # bit-exact


# ----------------------------------------------------------------------------- the example
def test_docs_example_builds_and_runs(releases, tmp_path):
    text = (REPO / "docs/runtime.md").read_text()
    block = re.search(r"```c\n(.*?)```", text, re.S)[1]
    assert block == (REPO / "runtime/example/example.c").read_text()
    assert 30 <= len(block.splitlines()) <= 50
    rel = releases["host"]
    (tmp_path / "example.c").write_text(block)
    env = {"PKG_CONFIG_PATH": str(rel / "runtime/x86_64/lib/pkgconfig"), "PATH": "/usr/bin:/bin"}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "modelyard"], capture_output=True,
                           text=True, env=env, check=True).stdout.split()
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", str(tmp_path / "example.c"), "-o",
                    str(tmp_path / "example"), *flags], check=True, capture_output=True)
    r = subprocess.run([str(tmp_path / "example"), str(rel), "alpha"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("chose cpu-x86_64 "), r.stdout + r.stderr
    assert re.search(r"\[0\] = -?[0-9.e+-]+\n", r.stdout)


CONSUMER = """cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(modelyard 0.1 REQUIRED)
add_executable(example example.c)
target_link_libraries(example PRIVATE modelyard::modelyard)
"""


def test_cmake_package_builds_the_example(releases, tmp_path):
    """find_package(modelyard) against a bundle's runtime/<arch>/lib/cmake: the docs example built
    and run, natively for x86_64 and with the cross toolchain for aarch64 (run under qemu)."""
    from pipeline.stages.runtime import TOOLCHAIN
    cmake = str(Path(sys.executable).parent / "cmake")
    for arch, rel in (("x86_64", releases["host"]), ("aarch64", releases["rk3588"])):
        src, build = tmp_path / arch / "src", tmp_path / arch / "build"
        src.mkdir(parents=True)
        (src / "CMakeLists.txt").write_text(CONSUMER)
        shutil.copy(REPO / "runtime/example/example.c", src / "example.c")
        args = [cmake, "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_C_FLAGS=-Wall -Werror",
                f"-DCMAKE_PREFIX_PATH={rel / 'runtime' / arch}"]
        if arch == "aarch64":
            (tmp_path / "aarch64.cmake").write_text(TOOLCHAIN.format(cc="aarch64-linux-gnu-gcc",
                                                                     cxx="aarch64-linux-gnu-g++"))
            args.append(f"-DCMAKE_TOOLCHAIN_FILE={tmp_path / 'aarch64.cmake'}")
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        for argv in (args, [cmake, "--build", str(build)]):
            r = subprocess.run(argv, capture_output=True, text=True, env=env)
            assert r.returncode == 0, r.stdout + r.stderr
        cache = (build / "CMakeCache.txt").read_text()
        assert f"modelyard_DIR:PATH={rel / 'runtime' / arch / 'lib/cmake/modelyard'}" in cache
        exe = [str(build / "example"), str(rel), "alpha"]
        r = subprocess.run([*QEMU, *exe] if arch == "aarch64" else exe, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.startswith(f"chose cpu-{arch} "), r.stdout + r.stderr
        assert re.search(r"y\[0\] = -?[0-9.e+-]+\n", r.stdout)


# ----------------------------------------------------------------------------- the C API
HEADER = REPO / "runtime/include/modelyard.h"


def api_functions() -> set[str]:
    """The functions modelyard.h exports (`MODELYARD_API <type> modelyard_x(`)."""
    return set(re.findall(r"MODELYARD_API [^;(]*?\b(modelyard_\w+)\(", HEADER.read_text()))


def test_header_is_c99_and_cxx_with_the_project_version(tmp_path):
    """modelyard.h's version macros are pyproject.toml's version; the header alone compiles as
    ISO C99 and C++11 with every warning an error; every function it declares is called by the
    C tests (runtime/tests/test_api.c; test_nms.c for the host-side NMS, run by
    tests/e2e/test_detector_postprocess.py)."""
    import tomllib
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    text = HEADER.read_text()
    parts = [re.search(rf"#define MODELYARD_VERSION_{k} (\d+)\n", text)[1] for k in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == version and f'#define MODELYARD_VERSION_STRING "{version}"\n' in text
    use = tmp_path / "use.c"
    use.write_text('#include "modelyard.h"\n'
                   "int main(void) { modelyard_options_t o; return (int)modelyard_default_options(&o); }\n")
    for argv in (["gcc", "-std=c99"], ["g++", "-std=c++11", "-x", "c++"]):
        r = subprocess.run([*argv, "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                            f"-I{HEADER.parent}", str(use)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    called = {f for c in sorted((REPO / "runtime/tests").glob("*.c"))
              for f in re.findall(r"\b(modelyard_\w+)\(", c.read_text())}
    assert len(api_functions()) >= 19 and api_functions() - called == set()


def exported(path: Path, shared: bool) -> set[str]:
    """The functions a library defines globally (nm reads both architectures' ELF)."""
    out = subprocess.run(["nm", "-D" if shared else "-g", "--defined-only", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[2] for line in out.splitlines() if len(line.split()) == 3}


def test_c_api_program_shared_and_static(releases, tmp_path):
    """runtime/tests/test_api.c, every entry point with its errors, threads included, built as an
    app builds it (find_package(modelyard) on the bundle, C99, warnings as errors) against
    libmodelyard.so and against libmodelyard.a, run by ctest on the IREE and the TVM artifact:
    x86_64 natively, aarch64 cross-compiled and run under qemu. Both libraries export exactly the
    header's functions (the .a hides IREE and cJSON as the .so does); each output is the golden
    vector's within its tolerance, and the same bytes from both libraries. Threads: four on one
    handle, 1000 set/run/get each natively (300 under qemu); without the handle's mutex the TVM
    artifact's VM broke in 4 of 4 tries of this (measured 2026-12-03), with it 0.5 s pass."""
    cmake = Path(sys.executable).parent / "cmake"
    ctest = Path(sys.executable).parent / "ctest"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for arch, rel in (("x86_64", releases["host"]), ("aarch64", releases["rk3588"])):
        lib = rel / "runtime" / arch / "lib"
        assert exported(lib / "libmodelyard.so", True) == api_functions()
        assert exported(lib / "libmodelyard.a", False) == api_functions()
        work = tmp_path / arch
        work.mkdir()
        (work / "lib").symlink_to(lib)  # a program linked with libmodelyard.a finds the TVM plugin in ../lib
        x = np.load(rel / "tests/alpha/input_0.npy")
        (work / "input.bin").write_bytes(np.ascontiguousarray(x).tobytes())
        abis_ = [f"cpu-{arch}", f"cpu-{arch}-tvm"]
        args = [str(cmake), "-S", str(REPO / "runtime/tests"), "-B", str(work / "build"), "-G", "Ninja",
                f"-DCMAKE_PREFIX_PATH={rel / 'runtime' / arch}", f"-DMODELYARD_TEST_RELEASE={rel}",
                "-DMODELYARD_TEST_MODEL=alpha", f"-DMODELYARD_TEST_ABIS={';'.join(abis_)}",
                f"-DMODELYARD_TEST_INPUT={work / 'input.bin'}"]
        if arch == "aarch64":
            from pipeline.stages.runtime import TOOLCHAIN
            (work / "aarch64.cmake").write_text(TOOLCHAIN.format(cc="aarch64-linux-gnu-gcc",
                                                                 cxx="aarch64-linux-gnu-g++"))
            args += [f"-DCMAKE_TOOLCHAIN_FILE={work / 'aarch64.cmake'}",
                     f"-DCMAKE_CROSSCOMPILING_EMULATOR={';'.join(QEMU)}"]
        runs = {"MODELYARD_TEST_THREAD_RUNS": "300"} if arch == "aarch64" else {}
        for argv in (args, [str(cmake), "--build", str(work / "build")],
                     [str(ctest), "--test-dir", str(work / "build"), "--output-on-failure", "--timeout", "600"]):
            r = subprocess.run(argv, capture_output=True, text=True, env={**env, **runs})
            assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
        assert "100% tests passed, 0 tests failed out of 4" in r.stdout, r.stdout
        golden = np.load(rel / "tests/alpha/output_0.npy")
        for abi in abis_:
            tol = abis(rel)[abi]["validation"]["tolerance"]
            shared, static = ((work / "build" / f"test_api_{kind}.{abi}.out").read_bytes()
                              for kind in ("shared", "static"))
            assert shared == static, abi
            y = np.frombuffer(shared, golden.dtype).reshape(golden.shape)
            assert np.abs(y - golden).max() <= tol["max_abs"], (abi, np.abs(y - golden).max(), tol)


# ----------------------------------------------------------------------------- reproducible
def test_two_builds_give_identical_bytes(releases, tmp_path):
    """The same sources built again in another folder (other absolute paths): the same bytes.
    That folder is inside a git work tree, as a clone's artifacts/ is: IREE's CMake then finds
    git and, unless told not to, fails checking submodules the vendored sources do not have."""
    first = releases["ws"].artifacts / "runtime" / "x86_64"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    ws = Workspace(tmp_path / "other")
    add_tiny_model(ws.models, "alpha", seed=3)
    r = ws.doit("runtime", "target=host", f"targets={releases['targets']}")
    assert r.returncode == 0, r.stdout + r.stderr
    second = ws.artifacts / "runtime" / "x86_64"
    assert (first / "runtime.tar").read_bytes() == (second / "runtime.tar").read_bytes()
    assert (first / "runtime.json").read_bytes() == (second / "runtime.json").read_bytes()
    assert (ws.artifacts / "logs/runtime/x86_64.log").is_file()
