"""One runtime's profile in `doit profile` (`side`: entries by time, the aggregate per op
category) and the comparison of the runtimes per category (`compare`)."""
from __future__ import annotations


STAGE = "profile"
ORT = "onnxruntime"


def side(entries: list[dict], *, total_ms: float, runtime: str, artifact: dict | None, how: str,
         mapping: str, outside: str) -> dict:
    """One runtime's profile: entries by time (each with its share of the entries' sum), the
    aggregate per category, the whole-run time beside the entries' sum."""
    kernels = sum(e["ms"] for e in entries)
    entries = sorted(entries, key=lambda e: (-e["ms"], e["name"]))
    for e in entries:
        e["ms"] = round(e["ms"], 6)
        e["share"] = round(e["ms"] / kernels, 6) if kernels else 0.0
    cats: dict[str, dict] = {}
    for e in entries:
        for cat, ms in (e.pop("split", None) or {e["category"]: e["ms"]}).items():
            c = cats.setdefault(cat, {"category": cat, "ms": 0.0, "entries": 0})
            c["ms"] += ms
            c["entries"] += 1
    by_category = sorted(cats.values(), key=lambda c: (-c["ms"], c["category"]))
    for c in by_category:
        c["ms"] = round(c["ms"], 6)
        c["share"] = round(c["ms"] / kernels, 6) if kernels else 0.0
    out = {"runtime": runtime, "how": how, "mapping": mapping, "total_ms": round(total_ms, 6),
           "entries_ms": round(kernels, 6), "outside": outside,
           "entries": entries, "by_category": by_category}
    if artifact is not None:
        out["artifact"] = {k: artifact[k] for k in ("path", "sha256", "format")}
    return out


def compare(sides: dict) -> list[dict]:
    """The categories of every side, with each side's ms and share: the op-by-op comparison."""
    cats: dict[str, dict] = {}
    for key, s in sides.items():
        for c in s["by_category"]:
            cats.setdefault(c["category"], {"category": c["category"]})[key] = {
                "ms": c["ms"], "share": c["share"]}
    first = next(iter(sides))
    return sorted(cats.values(), key=lambda c: (-c.get(first, {}).get("ms", 0.0), c["category"]))
