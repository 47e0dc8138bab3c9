"""Target registry (pipeline/targets/*.yaml) -> frozen, validated TargetSpecs.

Every problem found is collected and reported at once, naming the file and the key.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import PipelineError, SpecError
from ..core.store import sha256_file
from .common import NAME_RE, Problems, display, read_yaml
from .ship import parse_target as parse_ship
from .tvm import parse_abi as parse_tvm_abi

TARGETS_DIR = Path(__file__).resolve().parents[1] / "targets"
# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class AbiSpec:
    """One compiled form of a model for a target: a compiler backend, a device, how to run it.

    backend llvm-cpu:     arch, triple, cpu, cpu_features; run.via python (this machine) | qemu
    backend vulkan-spirv: vulkan_target, vulkan_features (replaces the target's SPIR-V version
                          and capabilities, e.g. for Vulkan 1.1 drivers); run.via vulkan (run the
                          artifact itself on run.driver) | twin (the artifact cannot run here:
                          validate a twin compiled for run.twin from the same static model)
    """
    name: str
    compiler: str
    backend: str
    flags: tuple[str, ...]
    run: dict
    arch: str | None = None
    triple: str | None = None
    cpu: str | None = None
    cpu_features: tuple[str, ...] = ()
    vulkan_target: str | None = None
    vulkan_features: str | None = None

    def compile_config(self) -> dict:
        if self.backend == "vulkan-spirv":
            return {"compiler": self.compiler, "backend": self.backend,
                    "vulkan_target": self.vulkan_target, "vulkan_features": self.vulkan_features,
                    "flags": list(self.flags)}
        return {"compiler": self.compiler, "backend": self.backend, "arch": self.arch,
                "triple": self.triple, "cpu": self.cpu, "cpu_features": list(self.cpu_features),
                "flags": list(self.flags)}

    def twin_config(self) -> dict:
        """The compile config of the runnable twin: same flags, the twin's Vulkan target."""
        return {**self.compile_config(), "vulkan_target": self.run["twin"], "vulkan_features": None}


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    abis: tuple[AbiSpec, ...]
    fallback: tuple[str, ...]   # the order an app tries the ABIs in
    path: Path
    sha256: str
    tvm_abis: tuple = ()        # tvm_compile.TvmAbi: `compiler: tvm` ABIs (abis holds IREE's)
    ship: tuple = ()            # choice.parse_target(): slots of ABIs, one of which ships

    @property
    def all_abis(self) -> tuple:
        return self.abis + self.tvm_abis


_TARGET_KEYS = {"description", "abis", "fallback", "ship"}
_CPU_KEYS = {"compiler", "backend", "arch", "triple", "cpu", "cpu_features", "flags", "run"}
_VULKAN_KEYS = {"compiler", "backend", "vulkan_target", "vulkan_features", "flags", "run"}
_RUN_KEYS = {"llvm-cpu": {"via", "device", "qemu_cpu"}, "vulkan-spirv": {"via", "driver", "twin"}}
_ARCHES = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}
BACKENDS = ("llvm-cpu", "vulkan-spirv")


def known_targets(targets_dir: Path = TARGETS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(targets_dir).glob("*.yaml"))


def load_target(name: str, targets_dir: Path = TARGETS_DIR) -> TargetSpec:
    targets_dir = Path(targets_dir)
    known = known_targets(targets_dir)
    if name not in known:
        raise PipelineError(f"unknown target {name!r}; known targets: {', '.join(known)}",
                            stage="spec", hint=f"say target=NAME with a known name, or add "
                                               f"{display(targets_dir / name)}.yaml")
    path = targets_dir / f"{name}.yaml"
    problems = Problems()
    raw = read_yaml(path, problems)
    where = display(path)
    abis = []
    fallback = ()
    ship = ()
    if isinstance(raw, dict):
        problems.unknown(where, raw, _TARGET_KEYS)
        if not isinstance(raw.get("abis"), dict) or not raw["abis"]:
            problems.append(f"{where}: abis: expected a non-empty mapping of ABI name -> definition")
        for abi_name, body in (raw.get("abis") or {}).items():
            abi = _abi(str(abi_name), body, f"{where}: abis.{abi_name}", problems)
            if abi:
                abis.append(abi)
        names = [a for a in (raw.get("abis") or {})] if isinstance(raw.get("abis"), dict) else []
        fallback = raw.get("fallback", names)
        if not isinstance(fallback, list) or sorted(map(str, fallback)) != sorted(names):
            problems.append(f"{where}: fallback: must list every ABI exactly once, in the order an "
                            f"app should try them (ABIs: {', '.join(names)}; got {fallback!r})")
        fallback = tuple(str(f) for f in fallback) if isinstance(fallback, list) else ()
        native = {a.name for a in abis if a.run.get("via") in ("python", "vulkan")}
        ship = parse_ship(raw.get("ship"), names, native, where, problems)
    elif not problems:
        problems.append(f"{where}: expected a mapping at the top level")
    if problems:
        raise SpecError(list(problems))
    return TargetSpec(name, str(raw.get("description", "")),
                      tuple(a for a in abis if a.compiler == "iree"), fallback, path,
                      sha256_file(path), tvm_abis=tuple(a for a in abis if a.compiler == "tvm"),
                      ship=ship)


def _strings(body: dict, key: str, where: str, problems: Problems) -> tuple[str, ...]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}.{key}: expected a list of strings")
        return ()
    return tuple(value)


def _abi(name: str, body, where: str, problems: Problems) -> AbiSpec | None:
    if not NAME_RE.match(name):
        problems.append(f"{where}: ABI name must match {NAME_RE.pattern}")
    if not isinstance(body, dict):
        problems.append(f"{where}: expected a mapping")
        return None
    if body.get("compiler") == "tvm":
        return parse_tvm_abi(name, body, where, problems)
    before = len(problems)
    backend = body.get("backend")
    if body.get("compiler") != "iree":
        problems.append(f"{where}.compiler: expected 'iree' or 'tvm', got {body.get('compiler')!r}")
    if backend not in BACKENDS:
        problems.append(f"{where}.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        return None
    problems.unknown(where, body, _CPU_KEYS if backend == "llvm-cpu" else _VULKAN_KEYS)
    run = body.get("run")
    if not isinstance(run, dict):
        problems.append(f"{where}.run: expected a mapping saying how to run the artifact here")
        run = {}
    problems.unknown(f"{where}.run", run, _RUN_KEYS[backend])
    flags = _strings(body, "flags", where, problems)
    if backend == "llvm-cpu":
        for key in ("arch", "cpu"):
            if key not in body:
                problems.append(f"{where}: missing required key {key!r}")
        arch = body.get("arch")
        if arch is not None and arch not in _ARCHES:
            problems.append(f"{where}.arch: {arch!r} is not one of {', '.join(_ARCHES)}")
        via = run.get("via")
        if via not in ("python", "qemu"):
            problems.append(f"{where}.run.via: expected 'python' (this machine's IREE runtime) or "
                            f"'qemu' (the target's own runtime under qemu-user), got {via!r}")
        if via == "qemu" and arch != "aarch64":
            problems.append(f"{where}.run.via: qemu runs aarch64 artifacts only (arch is {arch!r})")
        if via == "python" and arch != "x86_64":
            problems.append(f"{where}.run.via: python runs this machine's (x86_64) artifacts only")
        features = _strings(body, "cpu_features", where, problems)
        if len(problems) > before:
            return None
        return AbiSpec(name=name, compiler="iree", backend=backend, flags=flags,
                       arch=arch, triple=body.get("triple", _ARCHES[arch]), cpu=str(body["cpu"]),
                       cpu_features=features,
                       run={"via": via, "device": run.get("device", "local-task"),
                            **({"qemu_cpu": run.get("qemu_cpu", "max")} if via == "qemu" else {})})
    # vulkan-spirv
    target = body.get("vulkan_target")
    if not isinstance(target, str) or not target:
        problems.append(f"{where}: missing required key 'vulkan_target' (an IREE Vulkan target "
                        f"name, e.g. valhall3 for the Mali-G610)")
    features = body.get("vulkan_features")
    if features is not None and not isinstance(features, str):
        problems.append(f"{where}.vulkan_features: expected a string such as 'spirv:v1.3,cap:Shader'")
    via = run.get("via")
    if via not in ("vulkan", "twin"):
        problems.append(f"{where}.run.via: expected 'vulkan' (run the artifact itself here) or "
                        f"'twin' (validate a twin built for run.twin), got {via!r}")
    if via == "twin" and not isinstance(run.get("twin"), str):
        problems.append(f"{where}.run.twin: name the Vulkan target of the runnable twin (e.g. llvmpipe)")
    driver = run.get("driver", "lavapipe")
    if len(problems) > before:
        return None
    return AbiSpec(name=name, compiler="iree", backend=backend, flags=flags,
                   vulkan_target=target, vulkan_features=features,
                   run={"via": via, "driver": driver, **({"twin": run["twin"]} if via == "twin" else {})})
