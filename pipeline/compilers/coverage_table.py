"""The coverage table: per target and model, which stage or compiler stopped it and why.

Its rows (`row`), the manifest's table made from the manifest's own entries (`manifest_table`),
the text of a coverage.json's verdicts (`ops_text`, `compilers_text`) and the rendered table of
`doit coverage` (`render`). Pure functions of recorded reports: the coverage, choose and
manifest stages share them (a stage does not import another stage), and so does
graph/coverage_report.py, which reads the rows of `doit coverage` from disk.
"""
from __future__ import annotations

def ops_text(problems: list[dict]) -> str:
    """'GRU (2x: direction=bidirectional), Conv (...)', one entry per op."""
    by_op: dict = {}
    for p in problems:
        by_op.setdefault(p["op"], []).append(p["why"])
    parts = []
    for op, whys in sorted(by_op.items()):
        first = whys[0].split(": ", 1)[-1]
        parts.append(f"{op} ({len(whys)}x: {first})" if len(whys) > 1 else f"{op} ({first})")
    return ", ".join(parts)


# Per target and model: which stage or compiler stopped it and why, the rewrites applied, the
# ABIs that shipped (and with which fallback flags). In the manifest (`coverage`, every model
# shipped: a manifest is written only when every step succeeded) and `doit coverage target=T`
# (read from what the last build left on disk, failures included).
SHIPPED, STOPPED, NOT_BUILT = "shipped", "stopped", "not built"  # not built: or out of date


def compilers_text(report: dict | None) -> dict:
    """compiler -> "ok" or "skipped: <ops and why>" from a coverage.json."""
    return {c: "ok" if e["status"] == "ok" else f"skipped: {ops_text(e['unsupported'])}"
            for c, e in sorted(((report or {}).get("compilers") or {}).items())}


def rewrites_of(*reports: tuple[str, dict | None]) -> list[dict]:
    """The rewrites recorded by import.json / static.json (`rewrites`), each with its stage."""
    out = []
    for stage, report in reports:
        for r in (report or {}).get("rewrites") or ():
            out.append({"stage": stage, **(r if isinstance(r, dict) else {"rule": str(r)})})
    return out


def row(shipped: list, compilers: dict, rewrites: list, fallbacks: dict,
        stopped: dict | None = None, choice: dict | None = None, built: bool = True) -> dict:
    status = (STOPPED if stopped else SHIPPED if shipped else NOT_BUILT if not built
              else "nothing to ship")  # e.g. every ABI left out by the spec's skip:
    out = {"status": status, "shipped": list(shipped), "stopped": stopped, "compilers": compilers,
           "rewrites": rewrites, "fallbacks": fallbacks}
    if choice:
        out["choice"] = choice
    return out


def manifest_table(models: dict, compile_reports: dict, rewrites: dict) -> dict:
    """The manifest's coverage table from its own model entries; compile_reports: model ->
    ABI -> compile.json (IREE), for the fallbacks used; rewrites: model -> rewrites_of(...)."""
    table = {}
    for name, entry in models.items():
        fallbacks = {abi: c["fallback"] for abi, c in sorted(compile_reports.get(name, {}).items())
                     if c.get("fallback")}
        choice = {slot: c["ships"] for slot, c in (entry.get("choice") or {}).items()}
        table[name] = row(sorted(entry["artifacts"]), compilers_text({"compilers": entry.get("coverage") or {}}),
                          rewrites.get(name, []), fallbacks, choice=choice)
        # what a backend reported inside its own build (RKNN: ops run on the NPU's CPU
        # fallback, ops it cannot take): coverage facts no op table predicted
        reported = {abi: {k: c["messages"][k] for k in ("cpu_fallbacks", "unsupported")
                          if c["messages"].get(k)}
                    for abi, c in sorted(compile_reports.get(name, {}).items()) if c.get("messages")}
        reported = {abi: r for abi, r in reported.items() if r}
        if reported:
            table[name]["reported"] = reported
    return table


def render(target: str, table: dict) -> str:
    """The table as text: one line per model, then why each stopped model stopped."""
    rows = [("MODEL", "STATUS", "SHIPPED", "STOPPED BY", "REWRITES")]
    for name, r in table.items():
        shipped = ", ".join(f"{a} (fallback)" if a in r["fallbacks"] else a for a in r["shipped"])
        stop = r["stopped"]
        stopped = (f"{stop['stage']}" + (f" ({stop['step'].split('/')[-1]})" if stop["step"].count("/") >= 2 else "")
                   if stop else "-")
        names = {}
        for rw in r["rewrites"]:
            key = f"{rw['stage']}:{_rule(rw)}"
            names[key] = names.get(key, 0) + 1
        rewrites = ", ".join(k if n == 1 else f"{k} x{n}" for k, n in names.items()) or "-"
        rows.append((name, r["status"], shipped or "-", stopped, rewrites))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"coverage of target {target}: {sum(r['status'] == SHIPPED for r in table.values())} "
             f"of {len(table)} model(s) ship"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    for name, r in table.items():
        skipped = {c: t for c, t in r["compilers"].items() if t != "ok"}
        if r["stopped"] or skipped or r["fallbacks"] or r["rewrites"] or r["status"] == NOT_BUILT:
            lines.append(f"{name}:")
        for rw in r["rewrites"]:
            why = f": {rw['why']}" if rw.get("why") else ""
            lines.append(f"  rewrite {rw['stage']}:{_rule(rw)}{why}"[:300])
        for c, t in skipped.items():
            lines.append(f"  {c.upper()} {t}")
        for abi, fb in r["fallbacks"].items():
            change = ", ".join([f"without {f}" for f in fb["drop"]] + [f"with {f}" for f in fb["add"]])
            lines.append(f"  {abi} built with fallback flags ({change}): {fb['why']}; after {fb['after']}")
        if r["stopped"]:
            lines.append(f"  stopped by {r['stopped']['step']}:")
            lines += ["    " + l for l in r["stopped"]["why"].splitlines()]
        if r["status"] == NOT_BUILT:
            lines.append(f"  not built yet, or out of date (a spec, input or stage changed since): "
                         f"run `doit build target={target}`")
    return "\n".join(lines)


def _rule(rewrite: dict) -> str:
    """A rewrite's name as import.json / static.json record it (`rule`)."""
    return str(rewrite.get("rule") or rewrite.get("name") or "?")
