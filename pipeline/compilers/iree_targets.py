"""Facts about IREE's Vulkan targets, recorded per IREE version in iree_vulkan_targets.json.

Loading the project must not run a compiler: whether a `vulkan_target` name is known, and what
the compiler assumes about a device for it (SPIR-V version, device features, subgroups), are
looked up in a table that `probe` filled once per IREE version:

    python -m pipeline.compilers.iree_targets --refresh    # after installing another IREE

A record is what IREE stamps on the executables of a one-op probe module (its
`iree_gpu.target<...>` attribute), parsed as the compile stage parses a real model's.
A name the compiler rejects is simply absent from its version's table.

Table layout: {"format": 1, "versions": {IREE version: {target name: {features: record}}}},
where features is "" for the target's own features (no --iree-vulkan-target-features).
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from ..core.store import atomic_write_text, canonical_json, pretty_json, sha256_text
from ..core.tools import distribution_version, run_tool
from ..spec.common import display
from .iree_compiler import find_compiler
from .recorded import RecordedTable

TABLE = Path(__file__).with_name("iree_vulkan_targets.json")
DISTRIBUTION = "iree-base-compiler"

# The names refresh asks the compiler about (the ones TOOLCHAIN.md names; rejected ones drop out)
CANDIDATES = ("valhall3", "valhall4", "mali-g710", "mali-g610", "adreno", "videocore_vii",
              "llvmpipe", "vp_android_baseline_2022", "ampere", "rdna3", "sm_90", "hopper")
# (target, features) pairs recorded beside the plain targets: the lowering rk3588.yaml
# documents for Vulkan 1.1/1.2 drivers.
FEATURE_PAIRS = (
    ("valhall3", "spirv:v1.3,cap:Shader,cap:GroupNonUniform,cap:GroupNonUniformShuffle"),
)

PROBE_MLIR = """func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

# SPIR-V version -> the Vulkan API version that guarantees it.
SPIRV_TO_VULKAN = {"1.0": "1.0", "1.1": "1.1", "1.2": "1.1", "1.3": "1.1", "1.4": "1.2",
                   "1.5": "1.2", "1.6": "1.3"}
# target "compute"/"storage" types -> the VkPhysicalDevice feature a device must report.
TYPE_FEATURES = {("compute", "fp16"): "shaderFloat16", ("compute", "int8"): "shaderInt8",
                 ("storage", "b16"): "storageBuffer16BitAccess",
                 ("storage", "b8"): "storageBuffer8BitAccess"}
TARGET_RE = re.compile(r'iree_gpu\.target<arch = "([^"]+)", features = "([^"]*)", wgp = <([^>]*)>')


class TargetRejected(Exception):
    """The installed iree-compile does not accept this Vulkan target (or features)."""


def _key(features: str | None) -> str:
    return features or ""


def parse_target_info(text: str) -> dict:
    """The requirements of the first `iree_gpu.target<...>` found in compiler output."""
    match = TARGET_RE.search(text)
    if not match:
        raise ValueError("no iree_gpu.target attribute found")
    arch, features, wgp = match.groups()
    fields = {}
    for part in re.split(r",\s*(?=[a-z_]+ = )", wgp):
        key, _, value = part.partition(" = ")
        fields[key.strip()] = value.strip()
    spirv = re.search(r"spirv:v(\d+\.\d+)", features).group(1)
    compute = fields.get("compute", "").split("|")
    storage = fields.get("storage", "").split("|")
    needed = sorted({feat for (kind, typ), feat in TYPE_FEATURES.items()
                     if typ in (compute if kind == "compute" else storage)})
    subgroup = [] if fields.get("subgroup", "none") == "none" else fields["subgroup"].split("|")
    sizes = [int(x) for x in re.findall(r"\d+", fields.get("subgroup_size_choices", ""))]
    return {"arch": arch, "spirv_version": spirv, "vulkan_api": SPIRV_TO_VULKAN[spirv],
            "spirv_capabilities": sorted(c[4:] for c in features.split(",") if c.startswith("cap:")),
            "device_features": needed, "subgroup_operations": subgroup,
            "subgroup_size": sizes if subgroup else [],
            "max_workgroup_invocations": int(fields.get("max_thread_count_per_workgroup", 0)),
            "max_workgroup_memory_bytes": int(fields.get("max_workgroup_memory_bytes", 0))}


def requirements(text: str) -> dict:
    """Device requirements from the target IREE stamped on the module's executables (all alike)."""
    found = {json.dumps(parse_target_info(m.group(0)), sort_keys=True)
             for m in TARGET_RE.finditer(text)}
    if len(found) != 1:
        raise RuntimeError(f"expected one Vulkan target among the executables, found {len(found)}")
    return json.loads(found.pop())


def load_table(path: Path = TABLE) -> dict:
    return json.loads(Path(path).read_text())


def _versions() -> dict:
    return RECORDED.versions()


def lookup(target: str, features: str | None, iree_version: str) -> dict | None:
    """The recorded target record, or None when the table has no entry for that IREE version,
    target name or features (an unknown name under a recorded version: the compiler rejects it)."""
    record = _versions().get(iree_version, {}).get(target, {}).get(_key(features))
    return json.loads(json.dumps(record)) if record is not None else None  # a private copy


def known_names(iree_version: str) -> list[str]:
    """The Vulkan target names the table records as accepted by that IREE version (sorted)."""
    return sorted(_versions().get(iree_version, {}))


def has_version(iree_version: str) -> bool:
    return iree_version in _versions()


def installed_version() -> str:
    return RECORDED.installed_version()


def probe(target: str, features: str | None = None) -> dict:
    """Compile the one-op probe for a Vulkan target with the installed iree-compile and return
    its target record; raises TargetRejected when the compiler does not accept it."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dump = Path(tmp) / "probe.mlir", Path(tmp) / "executables.mlir"
        src.write_text(PROBE_MLIR)
        argv = [find_compiler(), str(src), "--iree-hal-target-device=vulkan",
                f"--iree-vulkan-target={target}", "--compile-to=executable-sources",
                "-o", str(dump)]
        if features:
            argv.insert(-2, f"--iree-vulkan-target-features={features}")
        result = run_tool(argv, log=None, what="iree-compile (Vulkan target probe)", check=False)
        if result.returncode != 0 or not dump.is_file():
            lines = ([l for l in result.output.splitlines() if "error" in l]
                     or result.output.splitlines() or [f"exit status {result.returncode}"])
            raise TargetRejected(lines[0].split("error:", 1)[-1].strip())
        return requirements(dump.read_text())


def vulkan_target_record(target: str, features: str | None, memo_dir: Path | None) -> dict:
    """What IREE compiles for a Vulkan target (its iree_gpu.target record: device features,
    subgroups): the recorded table; for a pair it lacks (features of the user's own), a one-op
    probe compile, memoised per IREE version."""
    version = distribution_version(DISTRIBUTION)
    recorded = lookup(target, features, version)
    if recorded is not None:
        return recorded
    key = sha256_text(canonical_json({"iree": version, "target": target, "features": features,
                                      "record": 2}))
    memo = memo_dir / "vulkan_target_records" / f"{key}.json" if memo_dir else None
    if memo and memo.is_file():
        return json.loads(memo.read_text())
    record = probe(target, features)
    if memo:
        atomic_write_text(memo, canonical_json(record))
    return record


def probe_all() -> dict:
    """{target: {features: record}} for the installed IREE (CANDIDATES and FEATURE_PAIRS)."""
    out: dict = {}
    for target, features in [(t, None) for t in CANDIDATES] + list(FEATURE_PAIRS):
        try:
            record = probe(target, features)
        except TargetRejected:
            continue
        out.setdefault(target, {})[_key(features)] = record
    return out


def render(table: dict) -> str:
    return pretty_json(table)


RECORDED = RecordedTable(TABLE, DISTRIBUTION, ask=probe_all)


def check_target(target) -> list[str]:
    """Problems with a loaded target's Vulkan ABIs: a target name (or twin) this IREE does not
    know. Read from the table: nothing runs. A table without the installed version is a problem
    too (refresh it), rather than a silent pass."""
    vulkan = [a for a in target.abis if a.backend == "vulkan-spirv"]
    if not vulkan:
        return []
    version = distribution_version(DISTRIBUTION)
    where = display(target.path)
    if not has_version(version):
        return [f"{where}: the table of IREE Vulkan targets ({TABLE.name}) has no entry for the "
                f"installed IREE {version}: run `python -m pipeline.compilers.iree_targets --refresh`"]
    known = known_names(version)
    problems = []
    for abi in vulkan:
        names = [abi.vulkan_target] + ([abi.run["twin"]] if abi.run.get("via") == "twin" else [])
        for name in names:
            if name not in known:
                problems.append(f"{where}: abis.{abi.name}: vulkan_target {name!r}: IREE {version} "
                                f"rejects it (known: {', '.join(known)}); Mali-G610 is 'valhall3', "
                                f"VideoCore VII is 'videocore_vii', lavapipe runs 'llvmpipe'")
    return problems


if __name__ == "__main__":
    raise SystemExit(RECORDED.main(None, __doc__.splitlines()[0],
                                   lambda v: ", ".join(known_names(v))))
