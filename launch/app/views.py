"""What the web app's Watch tab shows of a run, read from its directory: the curves of
metrics.jsonl, the last samples of samples.jsonl, and where the Ray dashboard is.

    series = curve_series(read_jsonl("runs/x/metrics.jsonl"))  # title -> (steps, values)
    fig = curve_figure("runs/x"); rows = latest_samples("runs/x", n=8)
"""

from __future__ import annotations

import contextlib
import math
import os
import socket

from common import metrics as M
from launch.rundir.writer import read_jsonl

CURVES = (
    (M.REWARD_MEAN, "reward"),
    (M.REWARD_CORRECT, "accuracy (samples)"),
    (M.REWARD_STRICT, "strict accuracy (samples)"),
    (M.REWARD_FORMAT, "format rate"),
    (M.ENTROPY, "entropy"),
    (M.LOSS_KL, "KL to the reference"),
    (M.LOGP_DIFF, "policy/logp_diff"),
    (M.STALENESS, "staleness"),
    (M.STEP_S, "s / step"),
    ("completions_per_s", "completions / s"),
)
"""Watch tab panels: (metrics.jsonl key, title)"""

SAMPLE_COLUMNS = ("step", "question", "answer", "completion", "reward", "error")
"""Watch tab samples table: samples.jsonl fields, in column order"""


def curve_series(rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """title -> (steps, values) of each Watch panel that has data; completions / s is the
    step's completions over its wall time."""
    out = {}
    for key, title in CURVES:
        pts = []
        for r in rows:
            if key == "completions_per_s":
                v = (r[M.ROLLOUT_COMPLETIONS] / r[M.STEP_S]
                     if M.ROLLOUT_COMPLETIONS in r and r.get(M.STEP_S) else None)
            else:
                v = r.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                pts.append((r[M.STEP], float(v)))
        if pts:
            out[title] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def curve_figure(run_dir: str):
    """A matplotlib figure, one small panel per curve (None before the first step)."""
    series = curve_series(read_jsonl(os.path.join(run_dir, "metrics.jsonl")))
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 5
    nrows = math.ceil(len(series) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(16, 3 * nrows), squeeze=False)
    for ax, (title, (steps, values)) in zip(axes.flat, series.items()):
        ax.plot(steps, values, marker="." if len(steps) < 30 else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series):]:
        ax.axis("off")
    fig.tight_layout()
    plt.close(fig)  # the page renders it; pyplot must not keep every figure alive
    return fig


def latest_samples(run_dir: str, n: int = 8) -> list[list]:
    """The last n sampled completions (samples.jsonl) as table rows (SAMPLE_COLUMNS)."""
    rows = read_jsonl(os.path.join(run_dir, "samples.jsonl"))[-n:]
    return [[r.get(c) for c in SAMPLE_COLUMNS] for r in reversed(rows)]


def dashboard_url(timeout_s: float = 0.3) -> str | None:
    """The Ray dashboard to link to: RAY_ADDRESS when it is a dashboard URL, else one
    listening on 127.0.0.1:8265 (`ray start --head`); local runs start Ray without one."""
    address = os.environ.get("RAY_ADDRESS", "")
    if address.startswith(("http://", "https://")):
        return address
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 8265), timeout_s):
        return "http://127.0.0.1:8265"
    return None
