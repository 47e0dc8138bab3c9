"""What a release was made from: a CycloneDX bill of materials and an in-toto/SLSA provenance.

* `sbom()`: CycloneDX 1.6 JSON through cyclonedx-python-lib. The release is the root component
  (type firmware); each model is a machine-learning-model component (its source file by
  sha256); each shipped artifact is a file component depending on its model and its compiler;
  the toolchain (Python packages by purl, binaries by sha256) are components too. Serial number
  and timestamp derive from the inputs and SOURCE_DATE_EPOCH, so the file is byte-reproducible.
* `statement()`: an in-toto Statement v1 whose predicate is SLSA Provenance v1. Subjects: the
  archive and each artifact by sha256. Resolved dependencies: the source models, the test or
  calibration data files, the specs and target definition, the tool versions.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from pathlib import Path

from packageurl import PackageURL

from ..compilers.backends import BACKENDS
from ..core.store import pretty_json, sha256_file
from ..core.tools import distribution_version

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:modelyard:release:v1"
BUILDER_ID = "urn:modelyard:builder:doit"
AARCH64_RUNTIME = "iree-runtime-aarch64"  # tools.py's name for the unpacked aarch64 wheel
AARCH64_TVM = "tvm-aarch64"                # tools.py's name for the aarch64 TVM wheel (+ Python)


def tool_purl(name: str, version: str) -> str | None:
    """A package URL for a Python tool; None for binaries (known by their sha256)."""
    if version.startswith("sha256:") or version == "missing":
        return None
    if name == AARCH64_RUNTIME:
        return f"pkg:pypi/iree-base-runtime@{version}?platform=manylinux_2_28_aarch64"
    if name == AARCH64_TVM:
        return f"pkg:pypi/apache-tvm@{version}?platform=manylinux_2_28_aarch64"
    return f"pkg:pypi/{name}@{version}"


def builder_versions() -> dict:
    return {name: distribution_version(name)
            for name in ("modelyard", "doit", "cryptography", "cyclonedx-python-lib")}


# ----------------------------------------------------------------------------- CycloneDX
# Tools whose licence a user must know of: RKNN-Toolkit2 has no licence file in its wheel; upstream's
# is the proprietary RKNN SDK License (development and testing for Rockchip products; docs/npu.md).
LICENSES = {"rknn-toolkit2": "LicenseRef-RKNN-SDK-License (proprietary, Rockchip)"}
MADE_BY = {Path(b.artifact).suffix: b.made_by for b in BACKENDS}  # an artifact's suffix -> its compiler


def sbom(release: dict, models: list, artifacts: list[dict], tools: dict, epoch: int,
         runtime: list[dict] = ()) -> str:
    """release: {target, version}; models: ModelSpecs; artifacts: {model, abi, path, sha256};
    runtime: the C runtime's libraries and programs {path, sha256, arch} (release.runtime_bundle)."""
    # cyclonedx: 0.1 s, not needed by doit list
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom, BomMetaData  # cyclonedx: 0.1 s, not needed by doit list
    # cyclonedx: 0.1 s, not needed by doit list
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6  # cyclonedx: 0.1 s, not needed by doit list

    def sha(digest: str) -> list:
        return [HashType(alg=HashAlgorithm.SHA_256, content=digest)]

    name = f"modelyard-{release['target']}"
    root = Component(type=ComponentType.FIRMWARE, name=name, version=release["version"],
                     bom_ref=f"{name}@{release['version']}",
                     description=f"ML model artifacts for the {release['target']} target")
    toolchain = {}
    for tool, version in sorted(tools.items()):
        purl = tool_purl(tool, version)
        toolchain[tool] = Component(
            type=ComponentType.LIBRARY if purl else ComponentType.APPLICATION, name=tool,
            version=None if version.startswith("sha256:") else version,
            hashes=sha(version[7:]) if version.startswith("sha256:") else None,
            purl=PackageURL.from_string(purl) if purl else None, bom_ref=f"tool:{tool}",
            properties=[Property(name="modelyard:license", value=LICENSES[tool])]
            if tool in LICENSES else None)
    components = {}
    for spec in models:
        components[spec.name] = Component(
            type=ComponentType.MACHINE_LEARNING_MODEL, name=spec.name, bom_ref=f"model:{spec.name}",
            description=spec.description or None, hashes=sha(spec.source_sha256),
            properties=[Property(name="modelyard:source_file", value=spec.source.name),
                        *[Property(name="modelyard:license_file", value=p.name)
                          for p in spec.licenses]])
    files = []
    for art in artifacts:
        files.append((art, Component(
            type=ComponentType.FILE, name=art["path"], bom_ref=f"file:{art['path']}",
            hashes=sha(art["sha256"]),
            properties=[Property(name="modelyard:abi", value=art["abi"]),
                        Property(name="modelyard:model", value=art["model"])])))
    sources = json.loads((Path(__file__).resolve().parents[2] / "third_party" / "sources.json").read_text())
    vendored = [Component(type=ComponentType.LIBRARY, name=a["name"], version=a["version"],
                          bom_ref=f"source:{a['name']}",
                          purl=PackageURL(type="github", namespace=a["repo"].split("/")[0],
                                          name=a["repo"].split("/")[1], version=a["commit"]),
                          properties=[Property(name="modelyard:commit", value=a["commit"]),
                                      Property(name="modelyard:license", value=a["spdx"])])
                for a in sources["archives"]] if runtime else []
    for lib in runtime:
        files.append(({"path": lib["path"], "model": None}, Component(
            type=ComponentType.LIBRARY if ".so" in lib["path"] else ComponentType.APPLICATION,
            name=lib["path"], bom_ref=f"file:{lib['path']}", hashes=sha(lib["sha256"]),
            version=release["version"] if "modelyard" in lib["path"] else None,
            properties=[Property(name="modelyard:arch", value=lib["arch"])])))
    content = json.dumps(sorted((a["path"], a["sha256"]) for a in [*artifacts, *runtime])
                         + sorted(tools.items()))
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL,
                                       f"urn:modelyard:{name}:{release['version']}:{content}"),
              metadata=BomMetaData(component=root,
                                   timestamp=datetime.fromtimestamp(epoch, tz=timezone.utc)))
    for component in [*components.values(), *toolchain.values(), *vendored, *(c for _, c in files)]:
        bom.components.add(component)
    bom.register_dependency(root, [c for _, c in files])
    for art, component in files:
        if art["model"] is None:  # the C runtime: built from the vendored sources
            bom.register_dependency(component, vendored)
            continue
        made_by = MADE_BY[Path(art["path"]).suffix]
        compiler = [toolchain[made_by]] if made_by in toolchain else []
        bom.register_dependency(component, [components[art["model"]], *compiler])
    return pretty_json(json.loads(JsonV1Dot6(bom).output_as_string()))


# ----------------------------------------------------------------------------- in-toto / SLSA
def statement(subjects: dict, models: list, target, tools: dict, external: dict, internal: dict,
              byproducts: dict) -> dict:
    """subjects and byproducts: name -> sha256; external: the parameters the caller chose
    (target, version, ...); internal: what the build itself fixed (build manifest, stage version)."""
    deps = []
    for spec in models:
        deps.append({"name": f"models/{spec.name}/{spec.source.name}",
                     "digest": {"sha256": spec.source_sha256}})
        deps.append({"name": f"models/{spec.name}/model.yaml",
                     "digest": {"sha256": sha256_file(spec.spec_path)}})
        for path in spec.input_files():  # test, calibration and evaluation data
            name = (path.relative_to(spec.dir).as_posix() if path.is_relative_to(spec.dir)
                    else path.name)
            deps.append({"name": f"models/{spec.name}/{name}",
                         "digest": {"sha256": sha256_file(path)}})
    deps.append({"name": f"targets/{target.name}.yaml", "digest": {"sha256": target.sha256}})
    for tool, version in sorted(tools.items()):
        purl = tool_purl(tool, version)
        deps.append({"name": tool, "uri": purl} if purl else
                    {"name": tool, "digest": {"sha256": version.removeprefix("sha256:")}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}}
                    for name, digest in sorted(subjects.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "internalParameters": internal,
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": builder_versions()},
                "byproducts": [{"name": name, "digest": {"sha256": digest}}
                               for name, digest in sorted(byproducts.items())],
            },
        },
    }
