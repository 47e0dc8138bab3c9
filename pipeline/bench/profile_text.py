"""`doit profile`'s table as text (and `doit bench`'s report of it): the top entries of each
runtime, their nodes, and the categories side by side."""
from __future__ import annotations

import re

from .profile_sides import ORT


TOP = 10


def nodes_text(entry: dict, graph_ops: dict | None = None, limit: int = 3) -> str:
    """The ONNX nodes of an entry, short: `Conv@43, Conv@48 (+ Add, Clip, Mul, Div)`."""
    nodes = entry["onnx_nodes"]
    text = ", ".join(nodes[:limit]) + (f" +{len(nodes) - limit}" if len(nodes) > limit else "")
    if entry.get("fused"):
        ops = []
        for n in entry["fused"]:
            op = n.split("@")[0].split("#")[0]
            if op not in ops:
                ops.append(op)
        text += f" (+ {', '.join(ops)})"
    return text or "-"


def _label(key: str, s: dict) -> str:
    return ORT if key == ORT else f"{key} ({s['runtime'].upper()})"


def _guessed(entries: list[dict]) -> str:
    """How many entries only their dispatch's name placed (a weaker mapping), if any."""
    n = sum(e.get("mapped_by") == "kind+shape" for e in entries)
    return f", {n} of them only by kind+shape (the dispatch name's op and dims)" if n else ""


def table(doc: dict, top: int = TOP) -> list[str]:
    """The printed profile: per runtime its top entries, then the per-category comparison."""
    lines = []
    for key, s in doc["runtimes"].items():
        lines.append("")
        lines.append(f"{_label(key, s)}: whole run {s['total_ms']:.3f} ms; its "
                     f"{len(s['entries'])} entries add up to {s['entries_ms']:.3f} ms "
                     f"({s['entries_ms'] / s['total_ms']:.0%}); mapped by "
                     f"{s['mapping'].split(':')[0]}{_guessed(s['entries'])}")
        rows = [("#", "ms", "share", "calls", "dispatch / kernel / node", "category", "ONNX nodes")]
        for k, e in enumerate(s["entries"][:top], 1):
            rows.append((str(k), f"{e['ms']:.3f}", f"{e['share']:.1%}", str(e["calls"]),
                         display_name(e["name"]), e["category"], nodes_text(e)))
        lines += _columns(rows)
    keys = list(doc["runtimes"])
    head = ("op kind", *(f"{k} ms / share" for k in keys))
    rows = [head]
    for c in doc["by_category"]:
        rows.append((c["category"], *(f"{c[k]['ms']:.3f} / {c[k]['share']:.1%}" if k in c else "-"
                                      for k in keys)))
    lines += ["", "time per ONNX op kind (each entry counted under its main node):"]
    lines += _columns(rows)
    for s in doc["not_profiled"]:
        lines.append(f"not profiled: {s['abi']}: {s['reason']}")
    return lines


def display_name(name: str, width: int = 56) -> str:
    """An entry's name as printed: IREE's `main$async_` prefix left out, long ones cut."""
    name = re.sub(r"^.*\$async_", "", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def _columns(rows: list[tuple]) -> list[str]:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
