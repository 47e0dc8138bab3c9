"""`doit release`: one target's validated artifacts as a signed, immutable, reproducible bundle.

    doit release target=rk3588 version=1.2.0 [key=PATH]    (or $MODELYARD_SIGNING_KEY)

artifacts/releases/<target>/<version>/
  manifest.json          every file below with sha256 and size, the waivers, SOURCE_DATE_EPOCH
  manifest.json.sig      Ed25519 signature of manifest.json (signing.py)
  release.json           per model the I/O contract; per artifact its file, runtime requirements,
                         validation figures, benchmark figures (or "not measured"), any waiver
  sbom.cdx.json          CycloneDX 1.6 bill of materials (provenance.py)
  build-manifest.json    artifacts/<target>/manifest.json as built: step keys, flags, tools
  models/<model>/<abi>/model.vmfb   (model.so for TVM artifacts)
  models/<model>/postprocess.onnx   a cut detector's post-processing, run on the host
                                    (spec postprocess; docs/postprocess.md)
  licenses/<model>/<file>
  modelyard-<target>-<version>.tar.gz   all of the above, under modelyard-<target>-<version>/
  provenance.intoto.jsonl               DSSE-signed in-toto Statement (SLSA Provenance v1)

What ships: every validated artifact, except where the target declares slots (the compiler
choice, choice.py): of a slot's candidates only the one the manifest's `choice` marks ships;
release.json records the choice, with its reason, per model.
Gates: an artifact whose validation status is not "passed" (e.g. "twin-passed": validated
through a twin build, the shipped bytes never ran) is refused unless its model spec waives it
(`release: {waivers: [{abi, reason}]}`); a used waiver is recorded in manifest.json.
Precision variants (`<model>.<variant>` in the build manifest) ship like models: the build
manifest lists only variants that passed their accuracy gate; they share their model's spec
(waivers, I/O contract) and licenses, and release.json says what they are a variant of.
Never emptier than meant: a build manifest with no model to ship is refused; so is a release
that lacks a model the previous version of the target (the highest lower semver in releases/)
shipped, unless `drop=NAME[,NAME...]` names each model it drops (an unknown name is refused
too); release.json then records them under `dropped`. A model shipped without a license file
(`licenses: []`) is named in a warning.
Reproducible: sorted entries, mtimes = SOURCE_DATE_EPOCH (default DEFAULT_EPOCH, never the
clock), owner 0/0 with no names, mode EXECUTABLE (0755) for the C runtime's programs (as the
runtime stage packed them) and REGULAR (0644) for every other file, in the release folder and
in the archive alike (members(): one Member per file, its mode included, for every writer of a
package); no gzip name or timestamp; Ed25519 signatures are deterministic.
Immutable: an existing version is never rewritten; the same content is a no-op, once the
existing bundle verifies against the signing key's public half (see _unchanged).
Atomic: everything is written in a scratch folder renamed into releases/ at the very end.
"""
from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path
from typing import NamedTuple

from . import deb, provenance

from . import signing
from ..compilers.backends import backend_for
from ..core.errors import PipelineError
from ..core.steps import RECORD
from ..core.store import pretty_json, sha256_file
from ..stages import runtime
from .verify import (MANIFEST, PROVENANCE, SIGNATURE, archive_name, check_bundle, digest,
                     file_digest)

VERSION = 1
SCHEMA = "modelyard.release/1"
MANIFEST_SCHEMA = "modelyard.release-manifest/1"
# semver.org 2.0.0, its own regular expression
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
                    r"(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
                    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z: a constant, so that no clock reaches the archive
NOT_DECLARED = "not declared in the model spec"
EXECUTABLE, REGULAR = 0o755, 0o644  # the only two modes a bundle's files have


class Ship(NamedTuple):
    """A file plan() or runtime_bundle() puts into the bundle: where it comes from, the sha256
    its validation saw (None: not validated, e.g. a license) and its mode in the bundle."""
    source: Path
    sha256: str | None
    mode: int = REGULAR


class Member(NamedTuple):
    """One file of a staged bundle as a package writer needs it: its path inside the bundle,
    the staged file and its mode (EXECUTABLE or REGULAR)."""
    name: str
    path: Path
    mode: int


def check_version(version: str | None, **where) -> str:
    if not version or not SEMVER.match(version):
        raise PipelineError(f"version {version!r} is not a semantic version (MAJOR.MINOR.PATCH, "
                            f"e.g. 1.4.0 or 2.0.0-rc.1)", **where,
                            hint="say version=X.Y.Z, without a leading v or leading zeros")
    return version


def precedence(version: str) -> tuple:
    """A sort key of a semantic version by semver.org's precedence (build metadata ignored; a
    pre-release below its release; numeric identifiers below alphanumeric ones)."""
    m = SEMVER.match(version)
    pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in m[4].split(".")) \
        if m[4] else ()
    return int(m[1]), int(m[2]), int(m[3]), 0 if pre else 1, pre


def source_date_epoch(**where) -> int:
    raw = os.environ.get("SOURCE_DATE_EPOCH")
    if raw is None:
        return DEFAULT_EPOCH
    if not raw.isdigit():
        raise PipelineError(f"SOURCE_DATE_EPOCH={raw!r} is not a whole number of seconds", **where,
                            hint="unset it (the default is 1980-01-01) or give seconds since 1970")
    return int(raw)


def run(project, target: str | None, version: str | None, key: str | None,
        with_runtime: bool = True, drop: str | None = None, *, formats: str | None = None) -> str:
    """Build (or confirm) artifacts/releases/<target>/<version>/; returns a summary.
    with_runtime: ship the C runtime (stage `runtime`) and the golden test vectors (runtime=0: not).
    drop: `drop=NAME,NAME` of doit release, the models the previous release of the target shipped
    that this one may lack (check_dropped); any other dropped model refuses the release.
    formats: `format=tar,deb`: tar (the default) publishes the bundle; deb cuts Debian packages
    from the same staged release into artifacts/packages/ (deb.py), alone: without publishing it."""
    where = {"stage": "release", "target": target}
    if not target:
        raise PipelineError("a release is for one target: say target=NAME", stage="release",
                            hint=f"known targets: {', '.join(t.name for t in project.targets)}")
    check_version(version, **where)
    kinds = deb.formats(formats, with_runtime, **where)
    private_key = signing.load_private_key(key, **where)
    epoch = source_date_epoch(**where)
    (spec,) = [t for t in project.targets if t.name == target]
    build_path = project.layout.manifest(target)
    if not build_path.is_file():
        raise PipelineError(f"no build manifest at {build_path}", **where,
                            hint=f"run `doit build target={target}` first (it failed, or never ran)")
    build = json.loads(build_path.read_text())
    ship, doc, waivers = plan(project, spec, build, **where)
    if not shipped_models(doc):
        raise PipelineError(
            f"the build manifest {build_path} lists no model with an artifact to ship: a release "
            f"of {target} would hold no model; nothing was released", **where,
            hint=f"build the models first (`doit build target={target}`), and check models=DIR: "
                 f"the folder of model folders (default models/)")
    dropped = check_dropped(project.layout, version, doc, drop, **where)
    for line in warnings_for(doc):
        print(f"modelyard: warning: [target={target} stage=release] {line}", file=sys.stderr,
              flush=True)
    runtime_files = runtime_bundle(project, spec, doc, ship, **where) if with_runtime else []
    if not with_runtime:
        doc["runtime"] = {"status": "not included (doit release runtime=0)"}
    # a precision variant's artifacts belong to its model's SBOM component
    artifacts = [{"model": entry.get("variant_of", m), "abi": a, "path": art["file"],
                  "sha256": art["sha256"]}
                 for m, entry in doc["models"].items() for a, art in entry["artifacts"].items()]
    models = [m for m in project.models if m.name in doc["models"]]
    tools = _tools(project.layout, build, **where)
    written = {"release.json": pretty_json(doc).encode(), "build-manifest.json": build_path.read_bytes(),
               "sbom.cdx.json": provenance.sbom({"target": target, "version": version}, models,
                                                artifacts, tools, epoch, runtime_files).encode()}
    head = {"schema": MANIFEST_SCHEMA, "target": target, "version": version,
            "archive_root": f"modelyard-{target}-{version}", "source_date_epoch": epoch,
            "waivers": waivers}

    scratch = project.layout.scratch("release", f"{target}/{version}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        manifest = _stage(scratch, ship, written, head, private_key, **where)
        archive = scratch / archive_name(head["archive_root"])
        write_archive(scratch, [*manifest["files"], MANIFEST, SIGNATURE], head["archive_root"],
                      epoch, archive)
        archive_sha, archive_size = file_digest(archive)
        statement = provenance.statement(
            subjects={archive.name: archive_sha, **{a["path"]: a["sha256"] for a in artifacts}},
            models=models, target=spec, tools=tools,
            external={"target": target, "version": version, "source_date_epoch": epoch,
                      "waivers": waivers},
            internal={"release_stage_version": VERSION, "target_definition_sha256": spec.sha256,
                      "build_manifest_sha256": manifest["files"]["build-manifest.json"]["sha256"]},
            byproducts={MANIFEST: file_digest(scratch / MANIFEST)[0],
                        "sbom.cdx.json": manifest["files"]["sbom.cdx.json"]["sha256"]})
        envelope = signing.dsse_envelope(private_key, pretty_json(statement).encode())
        (scratch / PROVENANCE).write_text(json.dumps(envelope, sort_keys=True) + "\n")

        final = project.layout.release(target, version)
        if final.exists():
            return _unchanged(final, (scratch / MANIFEST).read_bytes(), manifest,
                              private_key.public_key(), **where) + (
                "\n" + deb.run(project.layout, final, private_key, **where) if "deb" in kinds else "")
        if "tar" not in kinds:  # format=deb: the packages alone, cut from the staged release
            return f"{target} {version}: the bundle was not published (format=deb)\n" + \
                deb.run(project.layout, scratch, private_key, **where)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(scratch, final)
        packages = "\n" + deb.run(project.layout, final, private_key, **where) if "deb" in kinds else ""
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(project.layout.scratch("release", f"runtime-{target}"), ignore_errors=True)
    waived = ", ".join(f"{w['model']}/{w['abi']} ({w['status']})" for w in waivers) or "none"
    return (f"released {target} {version} -> {final}\n"
            f"  archive {archive.name}: sha256 {archive_sha} ({archive_size} bytes)\n"
            f"  {len(manifest['files'])} files in the signed manifest; key "
            f"{signing.key_id(private_key.public_key())[:16]}; waivers: {waived}"
            + (f"\n  dropped since {dropped['previous']} (drop=): {', '.join(dropped['models'])}"
               if dropped else "") + packages)


def shipped_models(doc: dict) -> set[str]:
    """The models (and variants) of a release.json that ship at least one artifact."""
    return {name for name, entry in doc.get("models", {}).items() if entry.get("artifacts")}


def previous_release(layout, target: str, version: str) -> tuple[str, Path] | None:
    """(version, folder) of the target's release of the highest precedence below `version`."""
    folder = layout.release(target, version).parent
    older = [p for p in folder.iterdir() if SEMVER.match(p.name) and (p / "release.json").is_file()
             and precedence(p.name) < precedence(version)] if folder.is_dir() else []
    if not older:
        return None
    last = max(older, key=lambda p: precedence(p.name))
    return last.name, last


def check_dropped(layout, version: str, doc: dict, drop: str | None, *, target: str,
                  **where) -> dict | None:
    """Refuse a release that lacks a model (or variant) the previous release of the target
    shipped, unless drop= names it; record the dropped ones in release.json (`dropped`).
    Returns that record, or None when nothing was dropped."""
    where = {"target": target, **where}
    confirmed = {n.strip() for n in (drop or "").split(",") if n.strip()}
    previous = previous_release(layout, target, version)
    before = set()
    if previous is not None:
        try:
            before = shipped_models(json.loads((previous[1] / "release.json").read_text()))
        except (OSError, ValueError, AttributeError) as exc:
            raise PipelineError(f"cannot read the previous release {previous[1] / 'release.json'} "
                                f"to see which models it shipped ({exc})", **where,
                                hint="releases are immutable: restore that folder from a copy") \
                from None
    dropped = sorted(before - shipped_models(doc))
    unknown = sorted(confirmed - set(dropped))
    if unknown:
        lacks = (f"{previous[0]} shipped and this one lacks: {', '.join(dropped) or 'none'}"
                 if previous else f"no earlier release of {target}: nothing to drop")
        raise PipelineError(f"drop={','.join(unknown)}: not a model this release drops (models the "
                            f"previous release {lacks}); nothing was released", **where,
                            hint="name in drop= only models the previous release shipped and "
                                 "this one lacks (spelled as in its release.json)")
    missing = [m for m in dropped if m not in confirmed]
    if missing:
        raise PipelineError(f"{version} would drop {len(missing)} model(s) that {previous[0]} "
                            f"shipped: {', '.join(missing)}; nothing was released", **where,
                            hint=f"build them (`doit build target={target}`; check models=DIR), "
                                 f"or confirm that they go: drop={','.join(dropped)}")
    if not dropped:
        return None
    doc["dropped"] = {"previous": previous[0], "models": dropped}
    return doc["dropped"]


def warnings_for(doc: dict) -> list[str]:
    """What the release ships but should not ship silently: models without a license file."""
    unlicensed = sorted({entry.get("variant_of", name) for name, entry in doc["models"].items()
                         if not entry["licenses"] and entry["artifacts"]})
    if not unlicensed:
        return []
    return [f"{len(unlicensed)} model(s) ship without a license file (licenses: [] in "
            f"release.json): {', '.join(unlicensed)}; name each model's license under `license:` "
            f"in its models/<model>/model.yaml"]


def runtime_bundle(project, target_spec, doc: dict, ship: dict, **where) -> list[dict]:
    """The C runtime of each architecture the target ships (stage `runtime`): runtime/<arch>/lib,
    bin, runtime/include, runtime/licenses; and each model's golden test vectors under
    tests/<model>/ (what `modelyard-run --check` compares with). Adds to `ship` and release.json;
    returns the SBOM's runtime components."""
    components, doc["runtime"] = [], {}
    scratch = project.layout.scratch("release", f"runtime-{target_spec.name}")  # removed by run()
    shutil.rmtree(scratch, ignore_errors=True)
    for arch in sorted({a.arch for a in target_spec.abis if a.arch}):
        folder = project.layout.runtime(arch)
        if not (folder / RECORD).is_file():
            raise PipelineError(f"no C runtime built for {arch} at {folder}", **where,
                                hint=f"run `doit runtime` (doit release runs it), or release with runtime=0")
        built = json.loads((folder / "runtime.json").read_text())
        names = runtime.unpack_runtime(folder / "runtime.tar", scratch / arch)
        for name in names:
            dest = f"runtime/include/{name.split('/', 1)[1]}" if name.startswith("include/") \
                else f"runtime/{arch}/{name}"
            if dest in ship and name.startswith("include/"):
                continue  # one header for every architecture
            unpacked = scratch / arch / name  # its mode as the runtime stage packed it (0755: bin/)
            ship[dest] = Ship(unpacked, built["files"][name]["sha256"],
                              EXECUTABLE if unpacked.stat().st_mode & 0o100 else REGULAR)
            if (name.startswith("lib/lib") and (".so" in name or name.endswith(".a"))) \
                    or name.startswith("bin/"):  # the static library holds IREE and cJSON too
                components.append({"path": dest, "sha256": built["files"][name]["sha256"], "arch": arch})
        doc["runtime"][arch] = {"lib": f"runtime/{arch}/lib", "bin": f"runtime/{arch}/bin/modelyard-run",
                                "include": "runtime/include", "iree": built["iree"],
                                "tvm_runtime": built["tvm_runtime"], "third_party": built["third_party"]}
        doc["runtime"]["third_party"] = built["third_party"]
    for lic in sorted((runtime.THIRD_PARTY / "licenses").iterdir()):
        ship[f"runtime/licenses/{lic.name}"] = Ship(lic, None)
    tvm_license = _tvm_license()
    if tvm_license is not None:
        ship["runtime/licenses/apache-tvm-LICENSE"] = Ship(tvm_license, None)
    for name, entry in doc["models"].items():
        golden = project.layout.model_stage(name, "golden")
        if not (golden / "golden.json").is_file():
            continue
        vectors = json.loads((golden / "golden.json").read_text())
        entry["test_vectors"] = {}
        for kind in ("inputs", "outputs"):
            entry["test_vectors"][kind] = [f"tests/{name}/{t['file']}" for t in vectors[kind]]
            for t in vectors[kind]:
                ship[f"tests/{name}/{t['file']}"] = Ship(golden / t["file"], None)
    return components


def _tvm_license() -> Path | None:
    try:
        dist = importlib.metadata.distribution("apache-tvm")
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f for f in dist.files or () if f.name.startswith("LICENSE")]
    return Path(dist.locate_file(found[0])) if found else None


def _stage(scratch: Path, ship: dict, written: dict, head: dict, private_key, **where) -> dict:
    """Copy the shipped files with their modes (checking each artifact is the validated one),
    write the generated ones (REGULAR), then the manifest listing them all and its signature;
    returns the manifest. Every mode is set, never left to the umask."""
    for name, (source, expected, mode) in sorted(ship.items()):
        sha, _ = _copy(source, scratch / name)
        (scratch / name).chmod(mode)
        if expected and sha != expected:
            raise PipelineError(f"{source} changed after it was validated: sha256 {sha}, the "
                                f"build manifest says {expected}", **where,
                                hint=f"run `doit build target={where['target']}` again")
    for name, data in written.items():
        (scratch / name).write_bytes(data)
        (scratch / name).chmod(REGULAR)
    files = sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())
    manifest = {**head, "files": {n: dict(zip(("sha256", "size"), file_digest(scratch / n)))
                                  for n in files}}
    data = pretty_json(manifest).encode()
    (scratch / MANIFEST).write_bytes(data)
    (scratch / SIGNATURE).write_text(pretty_json(signing.sign(private_key, data)))
    for name in (MANIFEST, SIGNATURE):
        (scratch / name).chmod(REGULAR)
    return manifest


# ----------------------------------------------------------------------------- what ships
def plan(project, target_spec, build: dict, **where) -> tuple[dict, dict, list]:
    """(bundle path -> Ship(source file, sha256 its validation saw or None, mode), release.json,
    waivers).

    Refuses, listing every one, the artifacts that are neither validated nor waived.
    """
    specs = {m.name: m for m in project.models}
    measured = _bench_figures(project.layout, target_spec.name)
    ship, models, waivers, refused = {}, {}, [], []
    for name, entry in sorted(build["models"].items()):
        spec = specs[entry.get("variant_of", name)]  # a variant ships under its model's spec
        artifacts = {}
        not_shipped = {abi for slot in entry.get("choice", {}).values()
                       for abi in slot["candidates"] if abi != slot["ships"]}
        for abi, art in sorted(entry["artifacts"].items()):
            if abi in not_shipped:
                continue  # another compiler's artifact ships for this device (entry["choice"])
            status = art["validation"]["status"]
            waiver = None
            if status != "passed":
                waiver = _waiver(spec, target_spec.name, abi, status)
                if waiver is None:
                    refused.append(f"{name}/{abi}: validation status {status!r}, not 'passed'")
                    continue
                waivers.append(waiver)
            file = f"models/{name}/{abi}/{Path(art['path']).name}"
            ship[file] = Ship(project.layout.resolve(art["path"]), art["sha256"])
            artifacts[abi] = _artifact(art, file, waiver, measured.get((name, abi, art["sha256"])))
        licenses = []
        for path in spec.licenses:
            licenses.append(f"licenses/{spec.name}/{path.name}")
            ship[licenses[-1]] = Ship(path, None)
        models[name] = {"description": entry["description"], "source": entry["source"],
                        "licenses": licenses, "io": _contract(spec, entry["io"]),
                        "artifacts": artifacts,
                        **{k: entry[k] for k in ("shape_of", "shape", "shapes") if k in entry}}
        if "postprocess" in entry and artifacts:  # a cut detector: its host-side step ships too
            pp, file = entry["postprocess"], f"models/{name}/postprocess.onnx"
            ship[file] = Ship(project.layout.model_stage(name, "static") / "postprocess.onnx",
                              pp["sha256"])
            models[name]["postprocess"] = {
                "file": file, "sha256": pp["sha256"], "cut": pp["cut"], "inputs": pp["inputs"],
                "outputs": pp["outputs"],
                "run": "onnxruntime on the host: feed the artifact's outputs (named as in `cut`, "
                       "in that order) and the model inputs it lists; it returns the model's own "
                       "outputs (docs/postprocess.md)"}
        if "variant_of" in entry:  # a precision variant: what it is, how it was made, its gate
            models[name].update({k: entry[k] for k in ("variant_of", "precision", "quantization",
                                                       "accuracy")})
        if "choice" in entry:
            models[name]["choice"] = {slot: {k: c[k] for k in ("ships", "policy", "reason")}
                                      for slot, c in sorted(entry["choice"].items())}
    if refused:
        body = "\n".join(f"  - {r}" for r in refused)
        raise PipelineError(f"{len(refused)} artifact(s) may not ship, nothing was released:\n{body}",
                            **where, hint="ship only artifacts that ran and matched golden; or waive "
                            "one in its models/<model>/model.yaml: release: {waivers: [{abi: NAME, "
                            "status: twin-passed, reason: '...'}]} (the waiver is recorded)")
    doc = {"schema": SCHEMA, "target": build["target"], "models": models}
    return ship, doc, waivers


def _waiver(spec, target: str, abi: str, status: str) -> dict | None:
    for w in spec.release.get("waivers", []):
        if w["abi"] == abi and w.get("target", target) == target and w.get("status", status) == status:
            return {"model": spec.name, "abi": abi, "target": target, "status": status,
                    "reason": w["reason"]}
    return None


def _contract(spec, io: dict) -> dict:
    """The model's I/O as compiled (names, shapes, dtypes) plus what the spec declares about it."""
    declared = spec.release.get("io", {})

    def tensor(t: dict, processing: str) -> dict:
        d = declared.get(t["name"], {})
        return {**t, "layout": d.get("layout", NOT_DECLARED),
                processing: d.get(processing, NOT_DECLARED)}

    return {"inputs": [tensor(t, "preprocessing") for t in io["inputs"]],
            "outputs": [tensor(t, "postprocessing") for t in io["outputs"]]}


def _bench_figures(layout, target: str) -> dict:
    """(model, abi, artifact sha256) -> figures of the target's last `doit bench`, if it measured
    the manifest being released (a bench of other bytes says nothing about these)."""
    summary_path, manifest_path = layout.bench_summary(target), layout.manifest(target)
    if not summary_path.is_file() or not manifest_path.is_file():
        return {}
    summary = json.loads(summary_path.read_text())
    if summary.get("manifest", {}).get("sha256") != sha256_file(manifest_path):
        return {}
    keep = ("p50_ms", "p90_ms", "p99_ms", "cv", "noisy", "n", "ratio_to_onnxruntime", "threads",
            "runner", "phases_p50_ms", "onnxruntime")
    return {(r["model"], r["abi"], r["sha256"]): {
        "status": "measured", **{k: r[k] for k in keep},
        "measured_on": summary["machine"].get("cpu_model", "?"),
        "started_utc": summary["started_utc"]} for r in summary.get("artifacts", [])}


def _artifact(art: dict, file: str, waiver: dict | None, measured: dict | None = None) -> dict:
    abi = art["abi"]
    vulkan = art.get("requires", {}).get("vulkan")
    runtime = backend_for(art).release_runtime(art)  # what loads it: the backend says
    requires = {**runtime,
                **{k: v for k, v in abi.items() if k not in ("name", "flags", "run", "compiler")}}
    if vulkan:  # API/SPIR-V version, device features and subgroup size, as IREE compiled for
        requires["vulkan"] = vulkan
    emulated = art["validation"]["executed"].get("emulated")
    benchmark = measured or {
        "status": "not measured",
        "note": "no timing was taken on the board" + (" (validation ran under emulation, whose "
                                                      "timings mean nothing)" if emulated else "")}
    return {"file": file, "sha256": art["sha256"], "size": art["size"], "format": art["format"],
            "entry": art["entry"], "requires": requires, "compile_flags": art["compile"]["flags"],
            "validation": {k: art["validation"][k]
                           for k in ("status", "executed", "tolerance", "tolerance_from", "outputs",
                                     "shipped_bytes_executed", "simulated", "twin", "detections")
                           if k in art["validation"]},
            "benchmark": benchmark, "waiver": waiver}


def _tools(layout, build: dict, **where) -> dict:
    """Every tool version that went into the artifacts: the model stages' and each artifact's."""
    tools = {}
    for name, entry in build["models"].items():
        stages = ("quantize", "accuracy", "golden") if "variant_of" in entry else (
            "import", "golden", "static")
        for stage in stages:
            owner = entry.get("shape_of", name) if stage == "import" else name  # shapes share it
            record = layout.model_stage(owner, stage) / RECORD
            if not record.is_file():
                raise PipelineError(f"{record} is missing", **where,
                                    hint=f"run `doit build target={where['target']}` again")
            tools.update(json.loads(record.read_text())["key_parts"]["tools"])
        for art in entry["artifacts"].values():
            tools.update(art["compile"]["tools"])
            tools.update(art["validation"]["tools"])
    return tools


# ----------------------------------------------------------------------------- writing
def _copy(source: Path, dest: Path) -> tuple[str, int]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as src, open(dest, "xb") as out:
        return digest(src, out)


def members(folder: Path, names: list[str]) -> list[Member]:
    """The files `names` of a staged bundle `folder`, sorted, each with its mode in any package:
    EXECUTABLE if its staged file is executable by its owner (_stage set it from Ship.mode),
    else REGULAR."""
    return [Member(name, folder / name,
                   EXECUTABLE if (folder / name).stat().st_mode & 0o100 else REGULAR)
            for name in sorted(names)]


def write_archive(folder: Path, names: list[str], root: str, epoch: int, out: Path) -> None:
    """A byte-reproducible .tar.gz of `names` (paths under `folder`), all under `root`/, each
    with its mode (members())."""
    with open(out, "xb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member in members(folder, names):
            info = tarfile.TarInfo(f"{root}/{member.name}")
            info.size = member.path.stat().st_size
            info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = \
                epoch, member.mode, 0, 0, "", ""
            with open(member.path, "rb") as f:
                tar.addfile(info, f)


def _unchanged(final: Path, manifest_bytes: bytes, manifest: dict, public_key, **where) -> str:
    """An existing release: the same content is a no-op, once the bundle on disk verifies.

    Verified as `doit verify` does, against a pinned key, never the key the bundle names: here
    the public half of the signing key given. It is the one key this run knows (it holds the
    private half and has just signed these very manifest bytes), whereas $MODELYARD_VERIFY_KEY
    and pyproject's verify_key say whom consumers trust, not who signs this release. So
    "unchanged" means this content signed by this key; a version signed by another key is
    refused (releases are immutable: it is not re-signed either)."""
    try:
        old = (final / MANIFEST).read_bytes()
    except OSError:
        raise PipelineError(f"{final} exists but holds no {MANIFEST}", **where,
                            hint="releases are immutable: find out what wrote it before you "
                                 "remove it by hand") from None
    if old != manifest_bytes:
        raise PipelineError(f"version {manifest['version']} of {manifest['target']} is already "
                            f"released with other content (differ: {_differences(old, manifest)}); "
                            f"a release is never rewritten", **where,
                            hint="release under a new version number")
    try:
        signer, problem = signing.check(json.loads((final / SIGNATURE).read_bytes()), old)
    except (OSError, ValueError):
        signer, problem = None, "unreadable"  # check_bundle below says what is wrong
    if problem is None and signer != signing.key_id(public_key):
        raise PipelineError(f"version {manifest['version']} of {manifest['target']} is already "
                            f"released with this content, but signed by key {signer[:16]}, not by "
                            f"this key {signing.key_id(public_key)[:16]}; a release is never "
                            f"re-signed", **where,
                            hint="sign with the key that made the release, or release under a "
                                 "new version number")
    try:
        check_bundle(final, public_key)
    except PipelineError as err:
        raise PipelineError(f"{final} has the same manifest but is damaged:\n{err.what}", **where,
                            hint="releases are immutable: restore it from a copy") from None
    return f"unchanged: {manifest['target']} {manifest['version']} is already released with this " \
           f"content at {final}"


def _differences(old: bytes, new: dict) -> str:
    """The files, then the other manifest fields, that differ between two release manifests."""
    try:
        old = json.loads(old)
    except ValueError:
        return "the old manifest.json is not JSON"
    before, after = old.get("files", {}), new["files"]
    files = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    fields = sorted(k for k in set(old) | set(new) if k != "files" and old.get(k) != new.get(k))
    shown = files[:8] + ([f"{len(files) - 8} more files"] if len(files) > 8 else []) + fields
    return ", ".join(shown)
