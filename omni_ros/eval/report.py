"""The human side of an evaluation: a one-screen text summary and a self-contained report.html.

Plots are drawn with matplotlib (Agg, no display) and embedded as base64 PNGs, camera frames likewise,
so the report is one file that can be mailed or attached to a CI run.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from omni_ros.eval.replay import Episode, Frame, ReplayResult

# Chunks drawn per trajectory plot (evenly spread), so long episodes stay readable.
MAX_CHUNKS_PLOTTED = 40


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def summary_text(doc: dict[str, Any], out_dir: str | Path | None = None) -> str:
    """The one-screen summary printed after an evaluation."""
    o, p = doc["overall"], doc["policy"]
    lines = [
        f"omni-ros eval ({doc['mode']}): {len(doc['bags'])} bag(s), {o['episodes']} episode(s); policy {p['model']} "
        f"on {p['backend']} ({p['precision']}), {p['action_dim']} joints, "
        f"horizon {p['action_horizon']} x {p['action_dt']:g} s",
        f"instants {o['instants']}: evaluated {o['evaluated']}, skipped {o['skipped']['total']}"
        + (
            " (" + "; ".join(f"{r}: {n}" for r, n in list(o["skipped"]["reasons"].items())[:3]) + ")"
            if o["skipped"]["total"]
            else ""
        ),
        f"aligned samples {o['aligned_samples']}   MSE {_fmt(o['mse'])}   MAE {_fmt(o['mae'])}   "
        f"first action MAE {_fmt(o['first_action']['mae'])}   end point MAE {_fmt(o['end_point']['mae'])}",
        "MAE per joint: " + "  ".join(f"{j} {_fmt(v, 3)}" for j, v in o["mae_per_joint"].items()),
    ]
    hold = o["baseline_hold"]
    if hold["scored_values"]:
        lines.append(f"constant baseline (hold the observed joint positions): MAE {_fmt(hold['mae'])}")
    steps = o["mae_per_step"]
    if steps:
        picks = sorted({0, len(steps) // 4, len(steps) // 2, len(steps) - 1})
        lines.append("MAE by horizon step: " + "  ".join(f"[{i}] {_fmt(steps[i], 3)}" for i in picks))
    cb, lat = o["chunk_boundary"], o["latency_ms"]
    lines.append(
        f"chunk boundary jump: mean {_fmt(cb['mean'], 3)}  p95 {_fmt(cb['p95'], 3)}  max {_fmt(cb['max'], 3)}   "
        f"inference latency: p50 {_fmt(lat['p50'], 3)} ms  p95 {_fmt(lat['p95'], 3)} ms"
    )
    if doc.get("realtime"):
        rt = doc["realtime"]
        ex = rt["executed"]
        lines.append(
            f"real time: {rt['chunks_received']} chunks, {rt['commands_received']} commands received; executed "
            f"commands MAE {_fmt(ex['mae'])} over {ex['samples']}; publishing late p95 "
            f"{_fmt(rt['lateness_ms']['p95'], 3)} ms"
        )
    eps = doc["episodes"]
    if eps:
        lines.append(f"{'episode':>7}  {'dur s':>6}  {'eval/inst':>10}  {'MAE':>8}  {'first':>8}  {'end':>8}  bag")
        shown = eps if len(eps) <= 8 else eps[:7]
        for e in shown:
            lines.append(
                f"{e['index']:>7}  {e['duration_s']:>6.1f}  {e['evaluated']:>4}/{e['instants']:<5}  "
                f"{_fmt(e['mae'], 3):>8}  {_fmt(e['first_action']['mae'], 3):>8}  {_fmt(e['end_point']['mae'], 3):>8}"
                f"  {Path(e['bag']).name}"
            )
        if len(eps) > len(shown):
            lines.append(f"{'...':>7}  ({len(eps) - len(shown)} more in metrics.json)")
    for b in doc["bags"]:
        sk = b["skipped_messages"]
        if sk["undecodable"] or sk["truncated"]:
            bad = sum(sk["undecodable"].values())
            lines.append(
                f"bag {b['path']}: {bad} message(s) skipped (undecodable)"
                + (f"; reading stopped early: {sk['truncated']}" if sk["truncated"] else "")
            )
    t = doc["timing"]
    total = t["total_s"] or 1.0
    if doc["mode"] == "realtime":
        lines.append(f"time {t['total_s']:.2f} s (played in real time; inference ran in the policy node)")
    else:
        lines.append(
            f"time {t['total_s']:.2f} s: read+decode {100 * t['read_decode_s'] / total:.1f}%, assembly "
            f"{100 * t['assemble_s'] / total:.1f}%, inference {100 * t['inference_s'] / total:.1f}%"
        )
    if out_dir is not None:
        lines.append(f"wrote {Path(out_dir) / 'metrics.json'} and {Path(out_dir) / 'report.html'}")
    return "\n".join(lines)


# ----- plots ---------------------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plot_trajectories(
    episode: Episode, joint_names: Sequence[str], executed: tuple[np.ndarray, np.ndarray] | None = None
) -> str:
    """Recorded ground truth per joint with the predicted chunks drawn over it (and executed commands)."""
    import matplotlib.pyplot as plt

    dims = len(joint_names)
    fig, axes = plt.subplots(dims, 1, figsize=(9, 1.6 * dims + 0.6), sharex=True, squeeze=False)
    t0 = episode.start
    track = episode.track
    preds = episode.predictions
    if len(preds) > MAX_CHUNKS_PLOTTED:
        preds = [preds[i] for i in np.linspace(0, len(preds) - 1, MAX_CHUNKS_PLOTTED).round().astype(int)]
    for j, ax in enumerate(axes[:, 0]):
        if track is not None and len(track):
            ax.plot(track.times - t0, track.values[:, j], color="black", lw=1.4, label="recorded")
        if executed is not None and len(executed[0]):
            ax.plot(executed[0] - t0, executed[1][:, j], color="tab:green", lw=1.0, ls="--", label="executed")
        for k, pred in enumerate(preds):
            times = pred.t0 + np.arange(len(pred.actions)) * pred.dt - t0
            ax.plot(
                times, pred.actions[:, j], color="tab:orange", lw=0.8, alpha=0.6, label="predicted" if k == 0 else None
            )
        ax.set_ylabel(joint_names[j], fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time in episode (s)")
    fig.suptitle(f"episode {episode.index}: predicted chunks vs recorded", fontsize=9)
    return _png(fig)


def plot_error_vs_horizon(doc: dict[str, Any]) -> str:
    import matplotlib.pyplot as plt

    dt = doc["policy"]["action_dt"]
    fig, ax = plt.subplots(figsize=(7, 3))
    for ep in doc["episodes"][:20]:
        vals = [np.nan if v is None else v for v in ep["mae_per_step"]]
        ax.plot(np.arange(len(vals)) * dt, vals, color="tab:blue", alpha=0.25, lw=0.8)
    mae = [np.nan if v is None else v for v in doc["overall"]["mae_per_step"]]
    rmse = [np.nan if v is None else np.sqrt(v) for v in doc["overall"]["mse_per_step"]]
    steps = np.arange(len(mae)) * dt
    ax.plot(steps, mae, color="tab:blue", lw=2, label="MAE (all episodes)")
    ax.plot(steps, rmse, color="tab:red", lw=1.5, label="RMSE (all episodes)")
    ax.set_xlabel("horizon (s after the observation)")
    ax.set_ylabel("error")
    ax.legend(fontsize=8)
    ax.set_title("error vs horizon (thin: episodes)", fontsize=9)
    return _png(fig)


def plot_latency(latencies_ms: Sequence[float]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.6))
    if latencies_ms:
        a = np.asarray(latencies_ms)
        ax.hist(a, bins=min(40, max(5, len(a) // 4)), color="tab:purple", alpha=0.8)
        for q, style in ((50, "-"), (95, "--")):
            v = np.percentile(a, q)
            ax.axvline(v, color="black", ls=style, lw=1, label=f"p{q} {v:.2f} ms")
        ax.legend(fontsize=8)
    ax.set_xlabel("inference latency (ms)")
    ax.set_ylabel("chunks")
    return _png(fig)


def plot_per_joint(doc: dict[str, Any]) -> str:
    import matplotlib.pyplot as plt

    o = doc["overall"]
    names = list(o["mae_per_joint"])
    fig, ax = plt.subplots(figsize=(7, 2.4))
    ax.bar(names, [v or 0.0 for v in o["mae_per_joint"].values()], color="tab:blue", label="MAE")
    ax.plot(
        names,
        [np.sqrt(v) if v is not None else 0.0 for v in o["mse_per_joint"].values()],
        "o",
        color="tab:red",
        label="RMSE",
    )
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8)
    return _png(fig)


def _frame_png(image: np.ndarray) -> str:
    import cv2

    ok, buf = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    return base64.b64encode(buf.tobytes()).decode("ascii") if ok else ""


def pick_frames(episodes: Sequence[Episode], count: int) -> list[tuple[int, Frame]]:
    """Up to `count` frames: first the opening frame of each episode, then later ones, spread evenly."""
    firsts = [(e.index, e.frames[0]) for e in episodes if e.frames]
    rest = [(e.index, f) for e in episodes for f in e.frames[1:]]
    if len(firsts) >= count:
        idx = np.linspace(0, len(firsts) - 1, count).round().astype(int)
        return [firsts[i] for i in sorted(set(idx))]
    need = count - len(firsts)
    if rest:
        idx = np.linspace(0, len(rest) - 1, min(need, len(rest))).round().astype(int)
        firsts += [rest[i] for i in sorted(set(idx))]
    return sorted(firsts, key=lambda x: (x[0], x[1].time))


# ----- html ----------------------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ddd; padding: 3px 8px; }
th { background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.frames { display: flex; flex-wrap: wrap; gap: 12px; } .frame { border: 1px solid #ddd; padding: 6px; }
.frame img { margin-right: 4px; } .cap { font-size: 12px; max-width: 420px; }
pre { background: #f7f7f7; padding: 10px; font-size: 12px; overflow-x: auto; }
"""


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for v in row:
            if isinstance(v, (int, float)) or v is None:
                cells.append(f'<td class="n">{_fmt(v) if isinstance(v, float) or v is None else v}</td>')
            else:
                cells.append(f"<td>{html.escape(str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def write_report(
    path: str | Path,
    doc: dict[str, Any],
    result: ReplayResult,
    plot_episodes: int = 3,
    frames: int = 4,
    executed: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """Write the self-contained HTML report; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    o, p = doc["overall"], doc["policy"]
    joints = doc["joint_names"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>omni_ros evaluation</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>omni_ros evaluation ({html.escape(doc['mode'])}): {html.escape(p['model'])} on "
        f"{html.escape(p['backend'])}</h1>",
        f"<pre>{html.escape(summary_text(doc))}</pre>",
        "<h2>Settings</h2>",
        _table(["key", "value"], [(k, v if isinstance(v, str) else str(v)) for k, v in doc["settings"].items()]),
        "<h2>Per joint</h2>",
        _table(
            ["joint", "MSE", "MAE"],
            [(j, o["mse_per_joint"][j], o["mae_per_joint"][j]) for j in joints],
        ),
        _img(plot_per_joint(doc), "per-joint error"),
        "<h2>Error vs horizon</h2>",
        _img(plot_error_vs_horizon(doc), "error vs horizon"),
        "<h2>Inference latency</h2>",
        _img(plot_latency([1e3 * x.latency_s for e in result.episodes for x in e.predictions]), "latency histogram"),
        "<h2>Episodes</h2>",
        _table(
            [
                "#",
                "bag",
                "start s",
                "dur s",
                "prompt",
                "instants",
                "evaluated",
                "skipped",
                "MSE",
                "MAE",
                "first MAE",
                "end MAE",
                "boundary p95",
            ],
            [
                (
                    e["index"],
                    Path(e["bag"]).name,
                    e["start_s"],
                    e["duration_s"],
                    e["prompt"],
                    e["instants"],
                    e["evaluated"],
                    e["skipped"]["total"],
                    e["mse"],
                    e["mae"],
                    e["first_action"]["mae"],
                    e["end_point"]["mae"],
                    e["chunk_boundary"]["p95"],
                )
                for e in doc["episodes"]
            ],
        ),
    ]
    if o["skipped"]["reasons"]:
        parts += ["<h2>Skipped instants</h2>", _table(["reason", "count"], list(o["skipped"]["reasons"].items()))]
    problems = [
        (b["path"], reason, n) for b in doc["bags"] for reason, n in b["skipped_messages"]["undecodable"].items()
    ] + [
        (b["path"], f"reading stopped: {b['skipped_messages']['truncated']}", 0)
        for b in doc["bags"]
        if b["skipped_messages"]["truncated"]
    ]
    if problems:
        parts += ["<h2>Bag problems</h2>", _table(["bag", "problem", "messages"], problems)]
    plotted = [e for e in result.episodes if e.predictions or (executed and e.index in executed)][:plot_episodes]
    if plotted:
        parts.append("<h2>Predicted vs recorded trajectories</h2>")
        for ep in plotted:
            ex = executed.get(ep.index) if executed else None
            parts.append(_img(plot_trajectories(ep, joints, ex), f"episode {ep.index} trajectories"))
    chosen = pick_frames(result.episodes, frames)
    if chosen:
        parts.append("<h2>Camera frames</h2><div class='frames'>")
        starts = {e.index: e.start for e in result.episodes}
        for index, frame in chosen:
            imgs = "".join(_img(_frame_png(im), f"{cam}") for cam, im in frame.images.items())
            t = frame.time - starts.get(index, 0.0)
            caption = f"episode {index}, t = {t:.2f} s ({', '.join(frame.images)}): “{frame.prompt}”"
            parts.append(f"<div class='frame'>{imgs}<div class='cap'>{html.escape(caption)}</div></div>")
        parts.append("</div>")
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
