"""Whether a precision variant pays: its artifact's p50 beside its model's fp32 artifact for the
same ABI, with onnxruntime's p50 on the variant's model and on the fp32 model, all four timed in
the same interleaved rounds. The record (`pays`) the build's choice step writes, the manifest
copies and `doit bench` prints, and its words: a variant slower than its fp32 build says so,
with the figures side by side and a `next:` hint.
"""
from __future__ import annotations


def ms_text(v: float) -> str:
    """Milliseconds as every timing table here prints them (3 decimals below 10 ms)."""
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def next_hint(precision: str) -> str:
    """What to do about a variant that does not pay on an ABI."""
    return (f"ship the fp32 build on this ABI (faster, and exact); keep the {precision} variant "
            f"only for its size, or for a device with {precision} kernels (the RK3588's NPU); "
            f"`doit profile model=<variant> target=<target>` shows which ops cost the time")


def slower_text(precision: str, p50_ms: float, fp32_p50_ms: float) -> str:
    """A precision variant slower than its fp32 build, in words (choice, manifest, bench)."""
    return (f"the {precision} artifact is SLOWER than its fp32 build here: p50 {ms_text(p50_ms)} ms vs "
            f"{ms_text(fp32_p50_ms)} ms ({fp32_p50_ms / p50_ms:.2f}x): it does not pay on this ABI")


def record(precision: str, p50_ms: float, fp32_p50_ms: float, ort_p50_ms: float | None,
           ort_fp32_p50_ms: float | None, where: str) -> dict:
    """The measured `pays` record: the four p50s, speedup = fp32 p50 / variant p50 (4
    significant digits: a variant 30x slower keeps its precision too), and for a variant that
    does not pay, why and next."""
    speedup = float(f"{fp32_p50_ms / p50_ms:.4g}")
    out = {"measured": True, "pays": speedup >= 1, "speedup": speedup, "p50_ms": p50_ms,
           "fp32_p50_ms": fp32_p50_ms, "onnxruntime_p50_ms": ort_p50_ms,
           "onnxruntime_fp32_p50_ms": ort_fp32_p50_ms, "where": where}
    if not out["pays"]:
        out["why"] = slower_text(precision, p50_ms, fp32_p50_ms)
        out["next"] = next_hint(precision)
    return out


def not_measured(why: str) -> dict:
    """A `pays` record for an artifact the build could not time (said rather than guessed)."""
    return {"measured": False, "why": why}


def figures_text(rec: dict) -> str:
    """The four p50s of a measured record, side by side, in one line."""
    def ms(v):
        return "n/a" if v is None else f"{ms_text(v)} ms"
    return (f"artifact p50 {ms(rec['p50_ms'])}, fp32 artifact {ms(rec['fp32_p50_ms'])} "
            f"(speedup {rec['speedup']:.2f}x); onnxruntime on the variant's model "
            f"{ms(rec['onnxruntime_p50_ms'])}, on fp32 {ms(rec['onnxruntime_fp32_p50_ms'])}")


def reason(precision: str, pays: dict) -> str:
    """A variant's choice in words: per ABI, whether it pays and the figures, or why not timed."""
    parts = []
    for abi, rec in sorted(pays.items()):
        if not rec["measured"]:
            parts.append(f"{abi}: not measured ({rec['why']})")
        elif rec["pays"]:
            parts.append(f"{abi}: the {precision} artifact pays, {rec['speedup']:.2f}x its fp32 "
                         f"build's speed ({figures_text(rec)})")
        else:
            parts.append(f"{abi}: {rec['why']} ({figures_text(rec)}); next: {rec['next']}")
    return "; ".join(parts)


def build_text(rec: dict) -> str:
    """What the build's choose step measured for a variant's artifact (the manifest's `pays`),
    as `doit bench` prints it."""
    if not rec["measured"]:
        return f"the build did not time it: {rec['why']}"
    said = "pays" if rec["pays"] else f"does NOT pay; next: {rec['next']}"
    return f"the build measured ({rec['where']}): {figures_text(rec)}: {said}"
