"""The `configs:` of a target's ABIs (doit search's candidates) and the pins that choose among
them (models/<m>/configs/<target>.yaml): strict checks, every problem with its file and key.
No toolchain runs here: specs and pins are read, nothing is compiled or timed."""
from __future__ import annotations

import json
import types

import pytest
import yaml

from conftest import REPO, add_tiny_model, sha256, tiny_onnx, write_spec
from pipeline.compilers.iree_compiler import attempts, compile_flags
from pipeline.core.errors import SpecError
from pipeline.core.tools import distribution_version
from pipeline.graph import load_project
from pipeline.spec import load_models, load_target
from pipeline.spec.target import PIN_FORMAT, pin_path, read_pin
from pipeline.bench import config_search
from pipeline.stages import choose, iree_compile

HOST = {
    "description": "test host",
    "abis": {
        "cpu-x86_64": {"compiler": "iree", "backend": "llvm-cpu", "arch": "x86_64",
                       "cpu": "x86-64-v3", "flags": ["--iree-opt-data-tiling"],
                       "configs": [{"name": "o3", "flags": ["--iree-opt-level=O3"], "why": "w"},
                                   {"name": "im2col", "why": "w",
                                    "flags": ["--iree-global-opt-use-im2col-for-convs"]}],
                       "run": {"via": "python"}},
        "cpu-x86_64-tvm": {"compiler": "tvm", "arch": "x86_64", "cpu": "x86-64-v3",
                           "run": {"via": "python"}},
    },
    "ship": {"cpu": {"abis": ["cpu-x86_64", "cpu-x86_64-tvm"]}},
}
BOARD = {
    "abis": {
        "cpu-aarch64": {"compiler": "iree", "backend": "llvm-cpu", "arch": "aarch64",
                        "cpu": "cortex-a55", "configs_from": "host/cpu-x86_64",
                        "configs": [{"name": "o3", "flags": ["--iree-opt-level=O3", "--x-arm"],
                                     "why": "w"},
                                    {"name": "im2col", "why": "w",
                                     "flags": ["--iree-global-opt-use-im2col-for-convs"]}],
                        "run": {"via": "qemu"}},
    },
}


def registry(tmp_path, host=None, board=None):
    folder = tmp_path / "targets"
    folder.mkdir(exist_ok=True)
    (folder / "host.yaml").write_text(yaml.safe_dump(host or HOST, sort_keys=False))
    (folder / "board.yaml").write_text(yaml.safe_dump(board or BOARD, sort_keys=False))
    return folder


def problems_of(folder, name="host") -> str:
    with pytest.raises(SpecError) as info:
        load_target(name, folder)
    return "\n".join(info.value.problems)


def with_configs(configs, **abi) -> dict:
    doc = json.loads(json.dumps(HOST))
    doc["abis"]["cpu-x86_64"].update(configs=configs, **abi)
    return doc


# ----------------------------------------------------------------------------- configs:
def test_configs_are_data_with_an_implicit_default(tmp_path):
    host = load_target("host", registry(tmp_path))
    abi = host.abis[0]
    assert [c["name"] for c in abi.configs] == ["o3", "im2col"]
    assert abi.config("default") == {"name": "default", "flags": (), "rewrites": ()}
    assert abi.config("o3") == {"name": "o3", "flags": ("--iree-opt-level=O3",), "rewrites": ()}
    assert abi.config("nope") is None
    assert [c["name"] for c in config_search.candidates(abi)] == ["default", "o3", "im2col"]
    # the registry's own host and rk3588 ABIs: the same candidate names, aarch64 follows host
    real = {t: load_target(t) for t in ("host", "rk3588")}
    x86 = next(a for a in real["host"].abis if a.name == "cpu-x86_64")
    arm = next(a for a in real["rk3588"].abis if a.name == "cpu-aarch64")
    assert 3 <= len(x86.configs) <= 24 and arm.configs_from == "host/cpu-x86_64"
    assert [c["name"] for c in arm.configs] == [c["name"] for c in x86.configs]
    assert "configs" not in x86.compile_config()  # candidates are not part of a build's key


@pytest.mark.parametrize("configs, extra, expected", [
    ([{"name": "o3", "flags": ["--a"], "why": "w"}, {"name": "o3", "flags": ["--b"], "why": "w"}],
     {}, "abis.cpu-x86_64.configs[1].name: duplicate config 'o3' (also configs[0])"),
    ([{"name": "default", "flags": ["--a"], "why": "w"}], {},
     "abis.cpu-x86_64.configs[0].name: 'default' is the config without extra flags"),
    ([{"name": "a", "flags": ["--x", "--y"], "why": "w"}, {"name": "b", "flags": ["--y", "--x"], "why": "w"}],
     {}, "abis.cpu-x86_64.configs[1]: the same flags and rewrites as config 'a'"),
    ([{"name": "dt", "flags": ["--iree-opt-data-tiling"], "why": "w"}], {},
     "configs[0].flags: --iree-opt-data-tiling already in the ABI's flags"),
    ([{"name": "O3", "flags": ["--iree-opt-level=O3"], "why": "w"}], {},
     "configs[0].name: a config name must match ^[a-z0-9][a-z0-9_-]*$, got 'O3'"),
    ([{"name": "o3", "flags": [], "why": "w"}], {},
     "configs[0]: give flags or rewrites (what config 'o3' changes)"),
    ([{"name": "up", "rewrites": ["upsample_faster"], "why": "w"}], {},
     "configs[0].rewrites[0]: 'upsample_faster' is not one of depthwise_conv_as_dense"),
    ([{"name": "o3", "flags": ["-O3"], "why": "w"}], {},
     "configs[0].flags[0]: expected an iree-compile flag (starting with --), got '-O3'"),
    ([{"name": "o3", "flags": ["--iree-opt-level=O3"]}], {}, "configs[0]: missing required key 'why'"),
    ([], {"configs_from": "host/cpu-x86_64"},
     "abis.cpu-x86_64.configs_from: declare the configs it follows"),
    ([], {"configs_from": "cpu-x86_64"}, "configs_from: expected TARGET/ABI"),
])
def test_bad_configs_are_named_with_file_and_key(tmp_path, configs, extra, expected):
    text = problems_of(registry(tmp_path, host=with_configs(configs, **extra)))
    assert "host.yaml: " in text and expected in text, text


def test_a_config_may_be_graph_rewrites_for_speed(tmp_path):
    host = with_configs([{"name": "up", "rewrites": ["conv_transpose_as_depth_to_space"],
                          "why": "ConvTranspose k == stride as Conv + DepthToSpace"}])
    abi = load_target("host", registry(tmp_path, host=host)).abis[0]
    assert abi.config("up") == {"name": "up", "flags": (),
                                "rewrites": ("conv_transpose_as_depth_to_space",)}


def test_a_tvm_abi_has_no_configs(tmp_path):
    host = json.loads(json.dumps(HOST))
    host["abis"]["cpu-x86_64-tvm"]["configs"] = [{"name": "prepack", "flags": ["--a"], "why": "w"}]
    assert "abis.cpu-x86_64-tvm: unknown key 'configs'" in problems_of(registry(tmp_path, host=host))


def test_configs_from_names_a_known_abi_with_the_same_config_names(tmp_path):
    models = tmp_path / "models"
    add_tiny_model(models, "m")
    board = json.loads(json.dumps(BOARD))
    board["abis"]["cpu-aarch64"]["configs"][1]["name"] = "im2col-only"
    folder = registry(tmp_path, board=board)
    with pytest.raises(SpecError) as info:
        load_project(models, tmp_path / "artifacts", "board", folder)
    assert ("abis.cpu-aarch64.configs_from: its configs (o3, im2col-only) must have the names of "
            "host/cpu-x86_64's (o3, im2col)") in str(info.value)
    board["abis"]["cpu-aarch64"]["configs_from"] = "nowhere/cpu-x86_64"
    folder = registry(tmp_path, board=board)
    with pytest.raises(SpecError) as info:
        load_project(models, tmp_path / "artifacts", "board", folder)
    assert "configs_from: no target 'nowhere'" in str(info.value)


def test_the_build_adds_a_pinned_config_after_the_abis_flags():
    key = {"compiler": "iree", "backend": "llvm-cpu", "arch": "x86_64", "triple": "x86_64-linux-gnu",
           "cpu": "x86-64-v3", "cpu_features": [], "flags": ["--iree-opt-data-tiling"],
           "fallbacks": [{"drop": ["--iree-opt-data-tiling"], "add": [], "why": "w"}],
           "config": {"name": "o3", "flags": ["--iree-opt-level=O3"], "rewrites": [], "pin": "host"}}
    assert compile_flags(key)[-2:] == ["--iree-opt-data-tiling", "--iree-opt-level=O3"]
    assert [a["flags"] for a in attempts(key)] == [
        ["--iree-opt-data-tiling", "--iree-opt-level=O3"], ["--iree-opt-level=O3"]]
    cfg = iree_compile.Config(**{k: v for k, v in key.items()}, entry="main")
    assert cfg.as_key()["config"] == key["config"]
    assert iree_compile.Config.from_key(cfg.as_key()) == cfg
    # without a pin the key has no `config`: builds before pins keep their keys
    plain = iree_compile.Config(**{k: v for k, v in key.items() if k != "config"}, entry="main")
    assert "config" not in plain.as_key()
    with pytest.raises(ValueError, match="a config is {name, flags, rewrites, pin}"):
        iree_compile.Config(**{**key, "config": {"name": "o3"}}, entry="main")
    with pytest.raises(ValueError, match="config 'o3': unknown rewrite"):
        iree_compile.Config(**{**key, "config": {**key["config"], "rewrites": ["nope"]}}, entry="main")


# ----------------------------------------------------------------------------- pins
def entry(config="o3", flags=("--iree-opt-level=O3",), compiler=None, slot=None) -> dict:
    return {"searched": {"date": "2026-12-01", "machine": {"cpu_model": "test"},
                         "tools": {"iree-base-compiler": compiler or distribution_version("iree-base-compiler")},
                         "window": {"rounds": 3}},
            "abis": {"cpu-x86_64": {"config": config, "flags": list(flags), "candidates": {}}},
            "slots": {"cpu": slot} if slot else {}}


def write_pin(models, model, target, body: dict) -> None:
    path = pin_path(models / model, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"format": PIN_FORMAT, "target": target, "models": body}))


def project(tmp_path, target="host", capsys=None):
    return load_project(tmp_path / "models", tmp_path / "artifacts", target, registry(tmp_path))


def test_a_pinned_config_is_what_the_build_compiles_with(tmp_path):
    models = tmp_path / "models"
    add_tiny_model(models, "m")
    write_pin(models, "m", "host", {"m": entry()})
    proj = project(tmp_path)
    want = {"name": "o3", "flags": ["--iree-opt-level=O3"], "rewrites": [], "pin": "host"}
    assert proj.configs == {("host", "m", "cpu-x86_64"): want}
    step = next(s for s in proj.steps("iree_compile") if s.name == "host/m/cpu-x86_64")
    assert step.config["config"] == want and "config o3" in step.doc
    # an ABI that follows the host's pin: the same config name, its own flags
    board = project(tmp_path, "board")
    assert board.configs == {("board", "m", "cpu-aarch64"): {
        "name": "o3", "flags": ["--iree-opt-level=O3", "--x-arm"], "rewrites": [], "pin": "host"}}
    # a model without a pin builds as before: no config in its key
    add_tiny_model(models, "n", seed=1)
    step = next(s for s in project(tmp_path).steps("iree_compile") if s.name == "host/n/cpu-x86_64")
    assert "config" not in step.config


def test_a_follower_takes_what_the_search_validated_for_it(tmp_path):
    """The host search pins, per follower, the fastest host config that validated there: the
    follower builds with that one, not with the host's winner."""
    models = tmp_path / "models"
    add_tiny_model(models, "m")
    body = entry()
    body["followers"] = {"board/cpu-aarch64": {
        "follows": "host/cpu-x86_64", "config": "im2col",
        "flags": ["--iree-global-opt-use-im2col-for-convs"],
        "candidates": {"o3": {"status": "failed", "stage": "validate", "why": "mean_abs"}}}}
    write_pin(models, "m", "host", {"m": body})
    assert project(tmp_path, "board").configs[("board", "m", "cpu-aarch64")] == {
        "name": "im2col", "flags": ["--iree-global-opt-use-im2col-for-convs"], "rewrites": [],
        "pin": "host"}
    assert project(tmp_path).configs[("host", "m", "cpu-x86_64")]["name"] == "o3"
    body["followers"]["board/cpu-aarch64"]["flags"] = ["--old"]
    write_pin(models, "m", "host", {"m": body})
    with pytest.raises(SpecError) as info:
        project(tmp_path, "board")
    assert ("configs/host.yaml: models.m.followers.board/cpu-aarch64.flags: config 'im2col' was "
            "measured with flags ['--old'] and rewrites []") in str(info.value)


@pytest.mark.parametrize("body, expected", [
    (entry(config="fast"), "configs/host.yaml: models.m.abis.cpu-x86_64.config: 'fast' is not a "
                           "config of host/cpu-x86_64 (it declares: default, o3, im2col): search again "
                           "(doit search target=host model=m)"),
    (entry(flags=("--iree-opt-level=O2",)), "models.m.abis.cpu-x86_64.flags: config 'o3' was "
                                            "measured with flags ['--iree-opt-level=O2']"),
    ({**entry(), "abis": {"cpu-x86_64-tvm": {"config": "o3", "flags": [], "candidates": {}}}},
     "models.m.abis.cpu-x86_64-tvm.config: a TVM ABI has no configs, only 'default'"),
    (entry(slot={"ships": "cpu-x86_64-gpu", "reason": "r", "sha256": {}, "figures": {}}),
     "models.m.slots.cpu: 'cpu-x86_64-gpu' is not an ABI of slot 'cpu' of host any more"),
    ({**entry(), "searched": {"date": "x"}}, "models.m.searched: missing required key 'machine'"),
])
def test_a_pin_the_registry_no_longer_declares_is_a_clear_error(tmp_path, body, expected):
    models = tmp_path / "models"
    add_tiny_model(models, "m")
    write_pin(models, "m", "host", {"m": body})
    with pytest.raises(SpecError) as info:
        project(tmp_path)
    assert expected in str(info.value), str(info.value)


def test_a_pin_searched_with_another_compiler_is_a_warning(tmp_path, capsys):
    models = tmp_path / "models"
    add_tiny_model(models, "m")
    write_pin(models, "m", "host", {"m": entry(compiler="0.0.1")})
    proj = project(tmp_path)
    assert proj.configs[("host", "m", "cpu-x86_64")]["name"] == "o3"  # still applied
    err = capsys.readouterr().err
    assert err.count("modelyard: warning:") == 1
    assert (f"m was searched with iree-base-compiler 0.0.1, this is "
            f"{distribution_version('iree-base-compiler')}") in err
    assert "doit search target=host model=m" in err


def test_a_pin_file_names_its_target(tmp_path):
    models = tmp_path / "models"
    add_tiny_model(models, "m")
    write_pin(models, "m", "host", {"m": entry()})
    path = pin_path(models / "m", "host")
    problems = []
    assert read_pin(path, "board", problems) is None
    assert "target: 'host', but the file is the pin of 'board'" in problems[0]


def _fake_project(models_dir):
    specs = load_models(models_dir, memo_dir=models_dir.parent / "memo")
    return types.SimpleNamespace(models=specs)


def test_the_search_writes_a_pin_the_build_reads(tmp_path):
    """config_search._entry + write_pin (no timing: the measured figures are given) -> a file
    that read_pin accepts: the winner is the lowest p50, a failed candidate is never pinned, the
    slot ships its fastest ABI; the folder's other models keep their entries."""
    models = tmp_path / "models"
    add_tiny_model(models, "m")
    target = load_target("host", registry(tmp_path))
    results = {"cpu-x86_64": {
        "default": {"flags": [], "status": "validated", "sha256": "a" * 64, "max_abs": 1e-6},
        "o3": {"flags": ["--iree-opt-level=O3"], "status": "validated", "sha256": "b" * 64,
               "max_abs": 2e-6},
        "im2col": {"flags": ["--iree-global-opt-use-im2col-for-convs"], "status": "failed",
                   "stage": "validate", "why": "outputs differ from golden"}}}
    tvm = {"cpu-x86_64-tvm": {"flags": [], "status": "validated", "sha256": "c" * 64, "max_abs": 0}}
    measured = {"rounds": 7, "threads": 2, "artifacts": [
        {"abi": "cpu-x86_64", "config": "default", "p50_ms": 3.0, "min_ms": 2.9},
        {"abi": "cpu-x86_64", "config": "o3", "p50_ms": 2.0, "min_ms": 1.9},
        {"abi": "cpu-x86_64-tvm", "config": "default", "p50_ms": 4.0, "min_ms": 3.9},
        {"abi": "onnxruntime", "p50_ms": 1.0, "min_ms": 0.9}]}
    body = config_search._entry(target, results, tvm, [], measured, config_search.WINDOW)
    x86 = body["abis"]["cpu-x86_64"]
    assert (x86["config"], x86["flags"]) == ("o3", ["--iree-opt-level=O3"])
    assert x86["candidates"]["default"]["ratio_to_onnxruntime"] == 3.0
    assert x86["candidates"]["im2col"]["status"] == "failed" and "p50_ms" not in x86["candidates"]["im2col"]
    slot = body["slots"]["cpu"]
    assert slot["ships"] == "cpu-x86_64" and slot["sha256"] == {"cpu-x86_64": "b" * 64,
                                                                "cpu-x86_64-tvm": "c" * 64}
    assert "cpu-x86_64 (config o3) p50 2.000 ms = 2.00x onnxruntime" in slot["reason"]
    assert "cpu-x86_64 is 2.00x faster" in slot["reason"]
    assert body["searched"]["onnxruntime"] == {"p50_ms": 1.0, "min_ms": 0.9}
    # another model of the folder keeps its entry; one the folder no longer has is dropped
    write_pin(models, "m", "host", {"m.gone": entry(), "m": entry(config="default", flags=())})
    path = config_search.write_pin(_fake_project(models), _fake_project(models).models[0], "host", body)
    assert path == models / "m" / "configs" / "host.yaml"
    assert path.read_text().startswith("# Written by `doit search target=host`")
    problems = []
    doc = read_pin(path, "host", problems)
    assert problems == [] and list(doc.models) == ["m"]
    assert doc.models["m"].abis["cpu-x86_64"].config == "o3"
    proj = project(tmp_path)
    assert proj.configs[("host", "m", "cpu-x86_64")]["flags"] == ["--iree-opt-level=O3"]
    assert proj.pinned_slots[("host", "m")]["cpu"]["ships"] == "cpu-x86_64"
    # a slot with fewer than two timed ABIs gets no pinned winner (its policy decides)
    body = config_search._entry(target, results, {}, [], measured, config_search.WINDOW)
    assert body["slots"] == {}


def test_nothing_validated_pins_nothing(tmp_path):
    target = load_target("host", registry(tmp_path))
    results = {"cpu-x86_64": {"default": {"flags": [], "status": "failed", "stage": "iree_compile",
                                          "why": "boom"}}}
    body = config_search._entry(target, results, {}, [], None, config_search.WINDOW)
    assert body["abis"]["cpu-x86_64"]["config"] is None and body["slots"] == {}


def test_a_shape_variant_does_not_inherit_its_models_explicit_choice(tmp_path):
    folder = tmp_path / "models" / "m"
    tiny_onnx(folder / "model.onnx")
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"),
               extra="shapes:\n  b2:\n    inputs:\n      x: {shape: [2, 3, 16, 16]}\n"
                     "ship:\n  host: {cpu: cpu-x86_64-tvm}\n")
    specs = {s.name: s for s in load_models(tmp_path / "models", memo_dir=tmp_path / "memo")}
    assert specs["m"].ship == {"host": {"cpu": "cpu-x86_64-tvm"}}
    assert specs["m.b2"].ship == {} and specs["m.b2"].shape_of == "m"
    # so the variant's choose step follows the pin or the policy, the model's its declaration
    steps = {s.name: s for s in project(tmp_path).steps("choose")}
    assert steps["host/m"].cfg.slots[0].explicit == "cpu-x86_64-tvm"
    assert steps["host/m.b2"].cfg.slots[0].explicit is None


def test_the_choice_follows_the_pin_only_for_the_bytes_it_timed(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"iree")
    b.write_bytes(b"tvm")
    slot = choose.Slot(name="cpu", order=("x", "y"), policy="prefer", candidates=("x", "y"),
                       skipped={}, explicit=None, proxy_of={}, golden_inputs=(),
                       pinned={"ships": "y", "reason": "y is 2x faster",
                               "sha256": {"x": sha256(a), "y": sha256(b)}})
    ctx = types.SimpleNamespace(input=lambda name: {"artifact:x": a, "artifact:y": b}[name])
    assert choose._stale(ctx, slot) is None
    b.write_bytes(b"tvm, retuned")
    assert choose._stale(ctx, slot) == "the search timed other bytes of y: search again (doit search)"
    assert "pinned" in choose.Slot.from_key(slot.as_key()).as_key()
    plain = choose.Slot(**{**{k: getattr(slot, k) for k in ("name", "order", "policy", "candidates",
                                                             "skipped", "explicit", "proxy_of",
                                                             "golden_inputs")}})
    assert "pinned" not in plain.as_key()  # slots without a pin keep their keys
