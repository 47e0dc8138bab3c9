"""The `ship:` sections: a target's slots (which ABIs stand for one device, and the policy that
picks the one that ships) and a model's explicit choices. The choice itself: pipeline/stages/choose.py.
"""
from __future__ import annotations

from ..core.errors import unknown_keys

POLICIES = ("prefer", "fastest-on-host")
_SLOT_KEYS = {"abis", "policy", "proxies"}


def parse_target(raw, abi_names: list[str], native: set[str], where: str, problems: list) -> tuple:
    """The target's `ship:` slots as a tuple of dicts (name, abis, policy, proxies)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append(f"{where}: ship: expected a mapping of slot name -> {{abis, policy}}")
        return ()
    slots, taken = [], {}
    for name, body in raw.items():
        sw = f"{where}: ship.{name}"
        if not isinstance(body, dict):
            problems.append(f"{sw}: expected a mapping with abis and policy")
            continue
        unknown_keys(problems, sw, body, _SLOT_KEYS)
        abis = body.get("abis")
        if not isinstance(abis, list) or len(abis) < 2 or not all(isinstance(a, str) for a in abis):
            problems.append(f"{sw}.abis: expected a list of two or more ABI names")
            continue
        for abi in abis:
            if abi not in abi_names:
                problems.append(f"{sw}.abis: no ABI {abi!r} in this target (it has: "
                                f"{', '.join(abi_names)})")
            elif abi in taken:
                problems.append(f"{sw}.abis: {abi!r} is already in slot {taken[abi]!r}")
            taken.setdefault(abi, name)
        policy = body.get("policy", "prefer")
        if policy not in POLICIES:
            problems.append(f"{sw}.policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        proxies = body.get("proxies", {})
        if not isinstance(proxies, dict):
            problems.append(f"{sw}.proxies: expected a mapping ABI -> TARGET/ABI")
            proxies = {}
        for abi, proxy in proxies.items():
            if abi not in abis:
                problems.append(f"{sw}.proxies: {abi!r} is not one of this slot's abis")
            if not isinstance(proxy, str) or proxy.count("/") != 1:
                problems.append(f"{sw}.proxies.{abi}: expected TARGET/ABI (e.g. host/cpu-x86_64), "
                                f"got {proxy!r}")
        if policy == "fastest-on-host":
            for abi in abis:
                if abi not in native and abi not in proxies:
                    problems.append(f"{sw}.proxies: {abi!r} does not run on this machine: name "
                                    f"its host proxy (an ABI of the host target, same compiler)")
        slots.append({"name": str(name), "abis": list(abis), "policy": policy,
                      "proxies": {str(k): str(v) for k, v in proxies.items()}})
    return tuple(slots)


def parse_model(raw, where: str, problems: list) -> dict:
    """A model's explicit choices: {target: {slot: abi}} (checked against targets later)."""
    if raw is None:
        return {}
    ok = isinstance(raw, dict) and all(
        isinstance(t, dict) and all(isinstance(a, str) for a in t.values()) for t in raw.values())
    if not ok:
        problems.append(f"{where}: ship: expected {{target: {{slot: abi}}}}, e.g. "
                        f"{{rk3588: {{cpu: cpu-aarch64-tvm}}}}")
        return {}
    return {str(t): {str(s): a for s, a in slots.items()} for t, slots in raw.items()}


def check_explicit(models, targets) -> list[str]:
    """Problems with the models' explicit choices against the loaded targets' slots."""
    problems = []
    by_name = {t.name: t for t in targets}
    for model in models:
        for target, slots in model.ship.items():
            spec = by_name.get(target)
            if spec is None:
                continue  # a target not loaded in this run (target=NAME)
            known = {s["name"]: s for s in spec.ship}
            for slot, abi in slots.items():
                where = f"{model.spec_path}: ship.{target}.{slot}"
                if slot not in known:
                    problems.append(f"{where}: target {target} has no slot {slot!r} (it has: "
                                    f"{', '.join(known) or 'none'})")
                elif abi not in known[slot]["abis"]:
                    problems.append(f"{where}: {abi!r} is not in the slot (candidates: "
                                    f"{', '.join(known[slot]['abis'])})")
    return problems
