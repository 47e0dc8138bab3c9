"""The release's rules as pure functions, no toolchain run: semver precedence, which models a
release drops since the previous one (drop=), the unlicensed-model warning, the file modes a
bundle carries and the modes an unpacked file gets (tests/e2e/test_release.py and
test_c_runtime.py run them through doit)."""
from __future__ import annotations

import io
import json
import os
import stat
import tarfile

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.layout import Layout
from pipeline.release import release
from pipeline.release.verify import extract, safe_mode


def test_precedence_is_semver_org_order():
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
               "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.9.0", "1.10.0", "2.0.0"]
    assert sorted(reversed(ordered), key=release.precedence) == ordered
    assert release.precedence("1.0.0+build.7") == release.precedence("1.0.0")


def _release_doc(**models) -> dict:
    """A release.json's `models`: name -> ABIs shipped (an empty list: listed, ships nothing)."""
    return {"models": {name: {"licenses": [], "artifacts": {abi: {} for abi in abis}}
                       for name, abis in models.items()}}


def _released(layout: Layout, version: str, doc: dict) -> None:
    folder = layout.release("host", version)
    folder.mkdir(parents=True)
    (folder / "release.json").write_text(json.dumps(doc))


def test_a_model_the_previous_release_shipped_is_dropped_only_when_drop_names_it(tmp_path):
    layout = Layout(tmp_path)
    _released(layout, "1.0.0", _release_doc(alpha=["cpu"], beta=["cpu"], gamma=["cpu"]))
    _released(layout, "2.0.0", _release_doc(alpha=["cpu"]))  # higher: not the previous of 1.1.0
    (layout.release("host", "0.9.0")).mkdir()  # no release.json: not a release
    now = _release_doc(alpha=["cpu"], gamma=[])  # gamma listed, but no artifact: dropped too
    assert release.previous_release(layout, "host", "1.1.0")[0] == "1.0.0"
    assert release.previous_release(layout, "host", "1.0.0-rc.1") is None

    with pytest.raises(PipelineError) as info:
        release.check_dropped(layout, "1.1.0", now, None, stage="release", target="host")
    assert info.value.render() == (
        "[target=host stage=release] 1.1.0 would drop 2 model(s) that 1.0.0 shipped: beta, gamma; "
        "nothing was released\n  next: build them (`doit build target=host`; check models=DIR), "
        "or confirm that they go: drop=beta,gamma")
    with pytest.raises(PipelineError, match=r"would drop 1 model\(s\) that 1.0.0 shipped: gamma;"):
        release.check_dropped(layout, "1.1.0", now, "beta", stage="release", target="host")
    with pytest.raises(PipelineError) as info:
        release.check_dropped(layout, "1.1.0", now, "beta,gamma,alpha,zeta", target="host")
    assert info.value.what == ("drop=alpha,zeta: not a model this release drops (models the previous "
                               "release 1.0.0 shipped and this one lacks: beta, gamma); nothing was "
                               "released")
    assert "dropped" not in now

    assert release.check_dropped(layout, "1.1.0", now, " beta, gamma ", target="host") == \
        {"previous": "1.0.0", "models": ["beta", "gamma"]}
    assert now["dropped"] == {"previous": "1.0.0", "models": ["beta", "gamma"]}  # in release.json
    # nothing dropped: nothing to confirm, nothing recorded; drop= without a previous release refused
    same = _release_doc(alpha=["cpu"], beta=["cpu"], gamma=["cpu"], delta=["cpu"])
    assert release.check_dropped(layout, "1.1.0", same, None, target="host") is None and "dropped" not in same
    with pytest.raises(PipelineError, match="drop=alpha: not a model this release drops .*no "
                                            "earlier release of host: nothing to drop"):
        release.check_dropped(layout, "0.1.0", same, "alpha", target="host")


def test_unlicensed_models_are_named_in_one_warning():
    doc = _release_doc(alpha=["cpu"], beta=["cpu"], gamma=[])
    doc["models"]["alpha.int8"] = {"variant_of": "alpha", "licenses": [], "artifacts": {"cpu": {}}}
    doc["models"]["beta"]["licenses"] = ["licenses/beta/LICENSE"]
    assert release.warnings_for(doc) == [
        "1 model(s) ship without a license file (licenses: [] in release.json): alpha; name each "
        "model's license under `license:` in its models/<model>/model.yaml"]
    doc["models"]["alpha"]["licenses"] = doc["models"]["alpha.int8"]["licenses"] = ["licenses/alpha/L"]
    assert release.warnings_for(doc) == []


def test_bundle_members_have_two_modes_whatever_the_umask(tmp_path):
    """What the archive (and any other package of the bundle) writes per file."""
    (tmp_path / "bin").mkdir()
    for name, mode in (("bin/run", 0o775), ("bin/readme", 0o664), ("lib.so", 0o700), ("a.json", 0o600)):
        (tmp_path / name).write_text(name)
        (tmp_path / name).chmod(mode)
    assert release.members(tmp_path, ["lib.so", "bin/run", "a.json", "bin/readme"]) == [
        release.Member("a.json", tmp_path / "a.json", 0o644),
        release.Member("bin/readme", tmp_path / "bin/readme", 0o644),
        release.Member("bin/run", tmp_path / "bin/run", 0o755),
        release.Member("lib.so", tmp_path / "lib.so", 0o755)]
    out = tmp_path / "b.tar.gz"
    release.write_archive(tmp_path, ["bin/run", "a.json"], "root", release.DEFAULT_EPOCH, out)
    with tarfile.open(out) as tar:
        assert [(m.name, m.mode) for m in tar] == [("root/a.json", 0o644), ("root/bin/run", 0o755)]


def test_unpacked_files_keep_their_mode_made_safe(tmp_path):
    """extract() (verify into=DIR) gives each file its archive mode without setuid, setgid,
    sticky or group/other write, whatever the umask; an all-0644 archive stays 0644."""
    assert [safe_mode(m) for m in (0o755, 0o644, 0o4777, 0o2755, 0o1777, 0o666, 0o700, 0o000)] == \
           [0o755, 0o644, 0o755, 0o755, 0o755, 0o644, 0o700, 0o600]
    manifest = json.dumps({"files": {}}).encode()
    archive = tmp_path / "a.tar.gz"
    modes = {"manifest.json": 0o644, "bin/run": 0o4777, "data": 0o666, "old": 0o644}
    with tarfile.open(archive, "w:gz") as tar:
        for name, mode in modes.items():
            data = manifest if name == "manifest.json" else name.encode()
            info = tarfile.TarInfo(f"root/{name}")
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    old = os.umask(0o077)
    try:
        dest = extract(archive, tmp_path / "board")
    finally:
        os.umask(old)
    got = {n: stat.S_IMODE((dest / n).stat().st_mode) for n in modes}
    assert got == {"manifest.json": 0o644, "bin/run": 0o755, "data": 0o644, "old": 0o644}
