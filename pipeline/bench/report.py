"""artifacts/<target>/report.html: the last bench run of a target, for people.

One self-contained file (inline CSS, inline SVG, no script, nothing fetched): the machine and
settings, the regression check when a baseline was given, then per model and precision a table
(artifact, size, validation errors, p50/p90/p99, ratio to onnxruntime, noise), the boundary split
(copy in / invoke / read back) and the latency distribution of every artifact next to
onnxruntime's, and a size-vs-latency plot; per model with a current `doit profile`, its top 10
dispatches / kernels / onnxruntime nodes side by side and the time per ONNX op kind. `render` is a
pure function of the bench summary, the per-artifact results, the manifest and the profiles.
"""
from __future__ import annotations

import math
from html import escape

from ..run.timing import NOISY_CV, PHASES
from ..run.variant_speed import build_text
from .profile import ORT, TOP, display_name, nodes_text

COLORS = {"total": "#2b6cb0", "onnxruntime": "#dd6b20", "copy_in": "#38a169",
          "invoke": "#2b6cb0", "read_back": "#805ad5"}
PHASE_LABEL = {"copy_in": "copy in", "invoke": "invoke", "read_back": "read back"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1a202c;margin:24px auto;
max-width:1100px;padding:0 16px;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #e2e8f0}
h3{font-size:15px;margin:18px 0 6px}.muted{color:#718096}.mono{font-family:ui-monospace,monospace}.warn{color:#c53030}
table{border-collapse:collapse;margin:6px 0 10px;width:100%}
th,td{border:1px solid #e2e8f0;padding:4px 7px;text-align:right;vertical-align:top}
th{background:#f7fafc;font-weight:600}td.l,th.l{text-align:left}
.noisy{color:#b7791f;font-weight:600}.bad{color:#c53030;font-weight:600}.good{color:#2f855a}
.skip{color:#718096;font-style:italic}.kv td{text-align:left}.kv td:first-child{width:200px;color:#4a5568}
.box{border:1px solid #e2e8f0;border-radius:6px;padding:8px 12px;margin:8px 0;background:#fafbfc}
svg{display:block;margin:4px 0 12px}svg text{font:11px system-ui,sans-serif;fill:#2d3748}
"""


def _ms(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _sci(v) -> str:
    return "n/a" if v is None else f"{v:.2g}"


def _nice_ticks(hi: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least hi."""
    if hi <= 0:
        return [0.0, 1.0]
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [round(k * step, 10) for k in range(int(math.ceil(hi / step)) + 1)]


def _tick_label(v: float) -> str:
    return f"{v:g}"


# ----------------------------------------------------------------------------- plots
def distribution_svg(result: dict) -> str:
    """Per-iteration samples of the artifact (total) and onnxruntime on one axis, with
    min-max whiskers, a p50-p90 bar and p50/p90/p99 marks."""
    samples = result["samples_ns"]
    series = [("artifact", "total"), ("onnxruntime", "onnxruntime")]
    hi = max(max(samples[k]) for _, k in series) / 1e6
    ticks = _nice_ticks(hi * 1.02)
    width, left, right, row_h, top = 1000, 110, 20, 52, 10
    height = top + row_h * len(series) + 34
    scale = (width - left - right) / ticks[-1]
    x = lambda ms: left + ms * scale
    out = [f'<svg width="{width}" height="{height}" '
           f'role="img" aria-label="latency distribution">']
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" '
                   f'y2="{top + row_h * len(series)}" stroke="#edf2f7"/>'
                   f'<text x="{x(t):.1f}" y="{top + row_h * len(series) + 14}" '
                   f'text-anchor="middle">{_tick_label(t)}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 4}" '
               f'text-anchor="middle">milliseconds per iteration (artifact: copy in + invoke + '
               f'read back)</text>')
    for row, (label, key) in enumerate(series):
        st = result["stats"][key]
        cy = top + row * row_h + row_h / 2
        color = COLORS[key]
        out.append(f'<text x="{left - 8}" y="{cy + 4:.1f}" text-anchor="end">{label}</text>')
        out.append(f'<line x1="{x(st["min_ms"]):.1f}" y1="{cy:.1f}" x2="{x(st["max_ms"]):.1f}" '
                   f'y2="{cy:.1f}" stroke="{color}" stroke-width="1"/>')
        out.append(f'<rect x="{x(st["p50_ms"]):.1f}" y="{cy - 9:.1f}" '
                   f'width="{max(x(st["p90_ms"]) - x(st["p50_ms"]), 1):.1f}" height="18" '
                   f'fill="{color}" fill-opacity="0.18" stroke="{color}"/>')
        for k, v in enumerate(samples[key]):
            jitter = ((k * 7919) % 17 - 8) * 1.6  # deterministic spread, so dots do not stack
            out.append(f'<circle cx="{x(v / 1e6):.1f}" cy="{cy + jitter:.1f}" r="1.8" '
                       f'fill="{color}" fill-opacity="0.45"/>')
        for name, dy in (("p50", -13), ("p90", -13), ("p99", 21)):
            v = st[f"{name}_ms"]
            out.append(f'<line x1="{x(v):.1f}" y1="{cy - 11:.1f}" x2="{x(v):.1f}" y2="{cy + 11:.1f}"'
                       f' stroke="#1a202c" stroke-width="{2 if name == "p50" else 1}"/>')
            if name != "p90" or x(st["p90_ms"]) - x(st["p50_ms"]) > 46:
                out.append(f'<text x="{x(v):.1f}" y="{cy + dy:.1f}" text-anchor="middle">'
                           f'{name} {_ms(v)}</text>')
    out.append("</svg>")
    return "".join(out)


def split_svg(row: dict) -> str:
    """The boundary split at p50: copy in, invoke, read back stacked; onnxruntime below, same scale."""
    ph = row["phases_p50_ms"]
    ort = row["onnxruntime"]["p50_ms"]
    hi = max(sum(ph.values()), ort)
    width, left, right = 1000, 110, 20
    scale = (width - left - right) / (hi * 1.02 or 1)
    out = [f'<svg width="{width}" height="86" role="img" '
           f'aria-label="boundary split">']
    x0 = left
    out.append(f'<text x="{left - 8}" y="22" text-anchor="end">artifact p50</text>')
    for p in PHASES:
        w = ph[p] * scale
        out.append(f'<rect x="{x0:.1f}" y="9" width="{max(w, 0.8):.1f}" height="18" '
                   f'fill="{COLORS[p]}"><title>{PHASE_LABEL[p]}: {_ms(ph[p])} ms</title></rect>')
        x0 += w
    out.append(f'<text x="{left - 8}" y="52" text-anchor="end">onnxruntime p50</text>'
               f'<rect x="{left}" y="39" width="{max(ort * scale, 0.8):.1f}" height="18" '
               f'fill="{COLORS["onnxruntime"]}"/>')
    legend = "   ".join(f"{PHASE_LABEL[p]} {_ms(ph[p])} ms" for p in PHASES)
    lx = left
    for p in PHASES:
        out.append(f'<rect x="{lx}" y="68" width="10" height="10" fill="{COLORS[p]}"/>'
                   f'<text x="{lx + 14}" y="77">{PHASE_LABEL[p]} {_ms(ph[p])} ms</text>')
        lx += 170
    out.append(f'<rect x="{lx}" y="68" width="10" height="10" fill="{COLORS["onnxruntime"]}"/>'
               f'<text x="{lx + 14}" y="77">onnxruntime {_ms(ort)} ms</text>')
    out.append(f"<title>{escape(legend)}</title></svg>")
    return "".join(out)


def scatter_svg(rows: list[dict]) -> str:
    """Artifact size (x) against p50 latency (y), one labelled point per measured artifact."""
    width, height, left, right, top, bottom = 760, 300, 70, 170, 14, 40
    xs = [r["size"] / 1e6 for r in rows]
    ys = [r["p50_ms"] for r in rows]
    xt, yt = _nice_ticks(max(xs) * 1.1), _nice_ticks(max(r["p90_ms"] for r in rows) * 1.05)
    sx = (width - left - right) / xt[-1]
    sy = (height - top - bottom) / yt[-1]
    X = lambda v: left + v * sx
    Y = lambda v: height - bottom - v * sy
    out = [f'<svg width="{width}" height="{height}" role="img" '
           f'aria-label="size versus latency">']
    for t in xt:
        out.append(f'<line x1="{X(t):.1f}" y1="{top}" x2="{X(t):.1f}" y2="{height - bottom}" '
                   f'stroke="#edf2f7"/><text x="{X(t):.1f}" y="{height - bottom + 14}" '
                   f'text-anchor="middle">{_tick_label(t)}</text>')
    for t in yt:
        out.append(f'<line x1="{left}" y1="{Y(t):.1f}" x2="{width - right}" y2="{Y(t):.1f}" '
                   f'stroke="#edf2f7"/><text x="{left - 6}" y="{Y(t) + 4:.1f}" '
                   f'text-anchor="end">{_tick_label(t)}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" text-anchor="middle">'
               f'artifact size (MB)</text><text x="14" y="{(top + height - bottom) / 2:.0f}" '
               f'transform="rotate(-90 14 {(top + height - bottom) / 2:.0f})" '
               f'text-anchor="middle">p50 latency (ms)</text>')
    for r, xv, yv in zip(rows, xs, ys):
        label = escape(f"{r['model']}/{r['abi']}")
        out.append(f'<line x1="{X(xv):.1f}" y1="{Y(r["p90_ms"]):.1f}" x2="{X(xv):.1f}" '
                   f'y2="{Y(r["min_ms"]):.1f}" stroke="{COLORS["total"]}" stroke-opacity="0.5"/>'
                   f'<circle cx="{X(xv):.1f}" cy="{Y(yv):.1f}" r="5" fill="{COLORS["total"]}">'
                   f'<title>{label}: {_size(r["size"])}, p50 {_ms(yv)} ms</title></circle>'
                   f'<text x="{X(xv) + 8:.1f}" y="{Y(yv) + 4:.1f}">{label}</text>')
    out.append("</svg>")
    return "".join(out)


# ----------------------------------------------------------------------------- page
def _validation_cell(outputs: list[dict]) -> str:
    def one(o: dict) -> str:
        if o.get("max_abs") is None:
            return escape(o["name"])
        cos = (f'cos {o["cosine"]:.7f}' if o.get("cosine") is not None else
               "cos not used (golden ~0)" if o.get("cosine_skipped") else "cos n/a")
        return f'{escape(o["name"])}: max {_sci(o["max_abs"])}, mean {_sci(o["mean_abs"])}, {cos}'
    return "<br>".join(one(o) for o in outputs)


def window_text(settings: dict) -> str:
    limits = [f"{settings['iterations']} iterations" if settings["iterations"] else "",
              f"{settings['seconds']:g} s" if settings["seconds"] else ""]
    return (f"warm-up {settings['warmup']}, then up to {' or '.join(l for l in limits if l)}"
            f"{', whichever comes first,' if all(limits) else ''} per artifact; artifact and "
            f"onnxruntime interleaved iteration by iteration")


def _precision(artifact: dict) -> str:
    # Artifacts of precision variants (pipeline/spec/variants.py) record `precision`; fp32 ones do not.
    return artifact.get("precision", "fp32")


def _runtime_label(key: str, side: dict) -> str:
    return ORT if key == ORT else f"{key} ({side['runtime'].upper()})"


def profile_html(model: str, doc: dict, top: int = TOP) -> str:
    """A model's profile: the top entries of each runtime side by side, then per ONNX op kind."""
    sides = doc["runtimes"]
    p = [f"<h3>{escape(model)}: where the time goes</h3><p class=\"muted\">doit profile, run "
         f"{escape(doc['started_utc'])}, {doc['threads']} thread(s), {doc['settings']['rounds']} "
         f"rounds of {doc['settings']['iterations']} runs per runtime, in turn. Share = of the "
         "runtime's entries' sum; an entry counts under its main ONNX node (a Conv with its fused "
         "activation counts as the Conv). " + "; ".join(
             f"{escape(_runtime_label(k, s))}: whole run {_ms(s['total_ms'])} ms, entries "
             f"{_ms(s['entries_ms'])} ms, mapped by {escape(s['mapping'].split(':')[0])}"
             for k, s in sides.items()) + "</p>",
         "<table><tr><th rowspan=2>#</th>" + "".join(
             f"<th colspan=3 class=l>{escape(_runtime_label(k, s))}</th>" for k, s in sides.items())
         + "</tr><tr>" + "<th class=l>dispatch / kernel / node: ONNX nodes</th><th>ms</th>"
                         "<th>share</th>" * len(sides) + "</tr>"]
    for k in range(min(top, max(len(s["entries"]) for s in sides.values()))):
        cells = []
        for s in sides.values():
            if k >= len(s["entries"]):
                cells.append("<td colspan=3></td>")
                continue
            e = s["entries"][k]
            cells.append(f"<td class=l><span class=mono title=\"{escape(e['name'])}\">"
                         f"{escape(display_name(e['name'], 80))}</span><br><span "
                         f"class=muted>{escape(e['category'])}: {escape(nodes_text(e))}</span></td>"
                         f"<td>{_ms(e['ms'])}</td><td>{e['share']:.1%}</td>")
        p.append(f"<tr><td>{k + 1}</td>{''.join(cells)}</tr>")
    p.append("</table><table><tr><th class=l>ONNX op kind</th>" + "".join(
        f"<th>{escape(_runtime_label(k, s))} ms</th><th>share</th>" for k, s in sides.items())
        + "</tr>")
    for c in doc["by_category"]:
        p.append(f"<tr><td class=l>{escape(c['category'])}</td>" + "".join(
            f"<td>{_ms(c[k]['ms'])}</td><td>{c[k]['share']:.1%}</td>" if k in c
            else "<td>-</td><td>-</td>" for k in sides) + "</tr>")
    p.append("</table>")
    return "\n".join(p)


def verdicts_html(variants: list[dict]) -> str:
    """The precision variants that do not pay (slower than their fp32 build), in words; then what
    the build's choose step measured for each (the manifest's `pays`)."""
    items = [f"<li class=warn><span class=mono>{escape(v['variant'])}/{escape(v['abi'])}</span>: "
             f"{escape(v['verdict'])}</li>" for v in variants if v.get("verdict")]
    items += [f"<li{' class=warn' if v['build_pays'].get('pays') is False else ''}><span "
              f"class=mono>{escape(v['variant'])}/{escape(v['abi'])}</span>: "
              f"{escape(build_text(v['build_pays']))}</li>" for v in variants if v.get("build_pays")]
    return "<ul>" + "".join(items) + "</ul>" if items else ""


def render(summary: dict, results: dict, manifest: dict, profiles: dict | None = None) -> str:
    target = summary["target"]
    mach = summary["machine"]
    by_key = {(r["model"], r["abi"]): r for r in summary["artifacts"]}
    skipped = {(s["model"], s["abi"]): s for s in summary["not_measured"]}
    ort_version = summary["versions"]["onnxruntime"]
    p = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
         f"<title>modelyard bench: {escape(target)}</title><style>{CSS}</style></head><body>",
         f"<h1>Bench report: target <span class=\"mono\">{escape(target)}</span></h1>",
         f"<p class=\"muted\">run started {escape(summary['started_utc'])} (UTC); manifest "
         f"<span class=\"mono\">{escape(summary['manifest']['path'])}</span> sha256 "
         f"<span class=\"mono\">{summary['manifest']['sha256'][:12]}</span></p>",
         "<table class=\"kv\">",
         f"<tr><td>CPU</td><td>{escape(mach['cpu_model'])} ({mach['arch']}), "
         f"{mach['logical_cpus']} logical CPUs, {mach['usable_cpus']} usable</td></tr>",
         f"<tr><td>threads</td><td>{summary['threads']} for the IREE device and for onnxruntime "
         f"(intra-op; spinning off)</td></tr>",
         f"<tr><td>load (1 min avg) at start</td><td>{mach['loadavg_1m_start']}</td></tr>",
         f"<tr><td>runtimes</td><td>iree-base-runtime {escape(summary['versions']['iree-base-runtime'])}"
         f", onnxruntime {escape(ort_version)}, numpy {escape(summary['versions']['numpy'])}</td></tr>",
         f"<tr><td>window</td><td>{escape(window_text(summary['settings']))}</td></tr></table>",
         "<div class=\"box\"><b>How to read this.</b> Latencies are per iteration, in milliseconds. "
         "An artifact's iteration is <i>copy in</i> (inputs to the device) + <i>invoke</i> + "
         "<i>read back</i> (outputs to host numpy); onnxruntime's is one <span class=\"mono\">"
         "InferenceSession.run</span> on the same model's static ONNX, same inputs, same thread "
         "count. <b>ratio</b> = artifact p50 / onnxruntime p50 from the same run (above 1: the "
         "artifact is slower); <b>paired</b> = median of the per-iteration ratios. "
         f"<span class=\"noisy\">noisy</span>: coefficient of variation (stddev / mean) above "
         f"{NOISY_CV:.2f} for the artifact or onnxruntime; the machine was busy, absolute numbers "
         "are shaky, the ratio less so. Emulated artifacts (qemu) are never timed.</div>"]

    reg = summary.get("regression")
    if reg:
        p.append(f"<h2>Regression check</h2><p>against <span class=\"mono\">{escape(reg['baseline'])}"
                 f"</span> (run {escape(str(reg['baseline_started_utc']))}); an artifact regresses "
                 f"when its p50 is worse by more than {reg['threshold_pct']:g}%.</p>")
        p.append("<table><tr><th class=l>model / abi</th><th>baseline p50 ms</th><th>p50 ms</th>"
                 "<th>change</th><th>ratio then → now</th><th class=l>same artifact</th>"
                 "<th class=l>status</th></tr>")
        for row in reg["rows"]:
            name = escape(f"{row['model']}/{row['abi']}")
            if "change_pct" not in row:
                p.append(f"<tr><td class=l>{name}</td><td colspan=6 class=l>{escape(row['status'])}"
                         "</td></tr>")
                continue
            cls = "bad" if row["status"] == "regressed" else "good"
            p.append(f"<tr><td class=l>{name}</td><td>{_ms(row['baseline_p50_ms'])}</td>"
                     f"<td>{_ms(row['p50_ms'])}</td><td class={cls}>{row['change_pct']:+.1f}%</td>"
                     f"<td>{row['baseline_ratio']:.2f}x → {row['ratio']:.2f}x</td>"
                     f"<td class=l>{'yes' if row['same_artifact'] else 'no (rebuilt)'}</td>"
                     f"<td class='l {cls}'>{row['status']}</td></tr>")
        p.append("</table>")
        if reg["missing_now"]:
            p.append("<p>in the baseline, not measured now: " + ", ".join(
                escape(f"{m['model']}/{m['abi']}") for m in reg["missing_now"]) + "</p>")

    for model, entry in sorted(manifest["models"].items()):
        groups: dict[str, list] = {}
        for abi, art in sorted(entry["artifacts"].items()):
            groups.setdefault(_precision(art), []).append((abi, art))
        for precision, arts in sorted(groups.items()):
            p.append(f"<h2>{escape(model)} <span class=\"muted\">· {escape(precision)}</span></h2>"
                     f"<p class=\"muted\">{escape(entry.get('description', ''))}; input "
                     + ", ".join(escape(f"{i['name']} {i['dtype']}{i['shape']}")
                                 for i in entry["io"]["inputs"]) + "</p>")
            p.append("<table><tr><th class=l>artifact</th><th>size</th><th class=l>validation "
                     "errors vs golden</th><th>n</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th>"
                     "<th>cv</th><th>onnxruntime p50 ms</th><th>ratio</th><th>paired</th></tr>")
            for abi, art in arts:
                cell = (f"<td class=l><span class=mono>{escape(abi)}</span><br><span class='mono "
                        f"muted'>{art['sha256'][:12]}</span></td><td>{_size(art['size'])}</td>"
                        f"<td class=l>{_validation_cell(art['validation']['outputs'])}</td>")
                row = by_key.get((model, abi))
                if row is None:
                    why = skipped.get((model, abi), {}).get("reason", "not measured")
                    p.append(f"<tr>{cell}<td colspan=8 class='l skip'>not measured here: "
                             f"{escape(why)}</td></tr>")
                    continue
                noisy = " <span class=noisy>noisy</span>" if row["noisy"] else ""
                p.append(f"<tr>{cell}<td>{row['n']}</td><td><b>{_ms(row['p50_ms'])}</b></td>"
                         f"<td>{_ms(row['p90_ms'])}</td><td>{_ms(row['p99_ms'])}</td>"
                         f"<td>{row['cv']:.2f}{noisy}</td><td>{_ms(row['onnxruntime']['p50_ms'])}"
                         f"</td><td><b>{row['ratio_to_onnxruntime']:.2f}x</b></td>"
                         f"<td>{row['paired_ratio_p50']:.2f}x</td></tr>")
            p.append("</table>")
            for abi, _ in arts:
                row = by_key.get((model, abi))
                if row is None:
                    continue
                res = results[row["result"]]
                st = res["stats"]
                p.append(f"<h3>{escape(model)}/{escape(abi)}: boundary split and distribution</h3>"
                         f"<p class=\"muted\">{res['window']['iterations']} iterations in "
                         f"{res['window']['seconds']} s (window ended by "
                         f"{escape(res['window']['ended_by'])}); min {_ms(st['total']['min_ms'])}, "
                         f"mean {_ms(st['total']['mean_ms'])} ± {_ms(st['total']['stddev_ms'])}, "
                         f"max {_ms(st['total']['max_ms'])} ms; onnxruntime min "
                         f"{_ms(st['onnxruntime']['min_ms'])}, mean {_ms(st['onnxruntime']['mean_ms'])}"
                         f" ± {_ms(st['onnxruntime']['stddev_ms'])} ms (cv "
                         f"{st['onnxruntime']['cv']:.2f}); result "
                         f"<span class=mono>{escape(row['result'])}</span></p>")
                p.append(split_svg(row))
                p.append(distribution_svg(res))
        if model in (profiles or {}):
            p.append(profile_html(model, profiles[model]))

    if summary.get("variants"):
        p.append("<h2>Precision variants vs fp32</h2><p class=\"muted\">each variant's artifact "
                 "next to its model's fp32 artifact for the same ABI; speedup = fp32 p50 / variant "
                 "p50 (IREE artifacts, same run).</p><table><tr><th class=l>model</th>"
                 "<th class=l>abi</th><th class=l>precision</th><th>size</th><th>fp32 size</th>"
                 "<th>p50 ms</th><th>fp32 p50 ms</th><th>speedup</th><th>onnxruntime p50 ms</th>"
                 "<th>onnxruntime fp32 p50 ms</th></tr>")
        for v in summary["variants"]:
            speed = "n/a" if v["speedup"] is None else f"{v['speedup']:.2f}x"
            p.append(f"<tr><td class=l>{escape(v['model'])}</td><td class=l>{escape(v['abi'])}</td>"
                     f"<td class=l>{escape(v['precision'])}</td><td>{_size(v['size'])}</td>"
                     f"<td>{_size(v['fp32_size']) if v['fp32_size'] else 'n/a'}</td>"
                     f"<td>{_ms(v['p50_ms'])}</td><td>{_ms(v['fp32_p50_ms'])}</td><td><b>{speed}</b>"
                     f"</td><td>{_ms(v['onnxruntime_p50_ms'])}</td>"
                     f"<td>{_ms(v['fp32_onnxruntime_p50_ms'])}</td></tr>")
        p.append("</table>")
        p.append(verdicts_html(summary["variants"]))
    if summary["artifacts"]:
        p.append("<h2>Size vs latency</h2><p class=\"muted\">one point per measured artifact at its "
                 "p50; the vertical line spans min to p90.</p>")
        p.append(scatter_svg(summary["artifacts"]))
    if summary["not_measured"]:
        p.append("<h2>Not measured here</h2><ul>")
        for s in summary["not_measured"]:
            ran = s.get("executed", {}).get("where", "")
            p.append(f"<li><span class=mono>{escape(s['model'])}/{escape(s['abi'])}</span>: "
                     f"not measured here: {escape(s['reason'])}"
                     + (f" (validated {escape(ran)})" if ran else "") + "</li>")
        p.append("</ul>")
    p.append(f"<p class=\"muted\">summary: <span class=mono>{escape(target)}/bench.json</span>; "
             "per artifact: <span class=mono>&lt;model&gt;/&lt;abi&gt;/bench/&lt;sha256&gt;.json"
             "</span> with every sample.</p></body></html>\n")
    return "\n".join(p)
