"""The `ship:` sections: a target's slots (which ABIs stand for one device, and the policy that
picks the one that ships) and a model's explicit choices. The choice itself: pipeline/stages/choose.py.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .common import Doc, Says

POLICIES = ("prefer", "fastest-on-host")


class SlotDoc(Doc):
    """ABIs of the target that stand for one device: one of them ships per model."""
    abis: Annotated[list[str], Field(min_length=2), Says("expected a list of two or more ABI names")]
    """in the order policy prefer tries them"""
    policy: Literal[POLICIES] = "prefer"
    """prefer: the first validated; fastest-on-host: the fastest validated here, measured"""
    build: Literal["all", "shipped"] = "all"
    """all: every candidate is built and validated (compilers compared); shipped: when the one
    that ships is known before building (the model's explicit choice, or policy prefer without a
    pin of doit search or a tuning budget), only it: the others are listed as skipped, and why"""
    proxies: dict[str, Annotated[str, Field(pattern=r"^[^/]*/[^/]*$"), Says(
        "expected TARGET/ABI (e.g. host/cpu-x86_64), got {input}")]] = {}
    """ABI -> TARGET/ABI timed here in its place (fastest-on-host, for an ABI that does not run here)"""


ModelShip = dict[str, dict[str, str]]  # target -> {slot: the ABI that ships}


def parse_target(doc: dict | None, abi_names: list[str], native: set[str], where: str,
                 problems: list) -> tuple:
    """The target's `ship:` slots as a tuple of dicts (name, abis, policy, proxies)."""
    slots, taken = [], {}
    for name, body in (doc or {}).items():
        sw = f"{where}: ship.{name}"
        if body is None or body.abis is None:
            continue
        for abi in body.abis:
            if abi not in abi_names:
                problems.append(f"{sw}.abis: no ABI {abi!r} in this target (it has: "
                                f"{', '.join(abi_names)})")
            elif abi in taken:
                problems.append(f"{sw}.abis: {abi!r} is already in slot {taken[abi]!r}")
            taken.setdefault(abi, name)
        proxies = body.proxies or {}
        for abi in proxies:
            if abi not in body.abis:
                problems.append(f"{sw}.proxies: {abi!r} is not one of this slot's abis")
        if body.policy == "fastest-on-host":
            for abi in body.abis:
                if abi not in native and abi not in proxies:
                    problems.append(f"{sw}.proxies: {abi!r} does not run on this machine: name "
                                    f"its host proxy (an ABI of the host target, same compiler)")
        slots.append({"name": name, "abis": list(body.abis), "policy": body.policy,
                      "proxies": dict(proxies),
                      **({"build": body.build} if body.build != "all" else {})})  # keys as before
    return tuple(slots)


def parse_model(doc: dict | None) -> dict:
    """A model's explicit choices: {target: {slot: abi}} (checked against targets later)."""
    return {t: dict(slots) for t, slots in (doc or {}).items()}


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
