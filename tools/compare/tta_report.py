"""Time to a target accuracy, the results: times to target from the scored curves, the report
(a line per run, the median per system, the ratio last), the plot, and `--join` of several
results.json into one (more seeds). Pure over results.json: no model, no Ray.

results.json: {"args": the bench's flags, "base": the base model's accuracy, "target",
"runs": [{"system", "seed", "setup_s", "steps", "clock_s", "curve": [(seconds, step,
accuracy), ...], "eval_s", "tta_s"}, ...], "lines": the report}.
"""

from __future__ import annotations

import json
import math
import os
import statistics

from tools.compare.settings import TRL_ENGINES, machine_line

SET = "arith-1-unseen"
"""the held-out set both systems are scored on: question templates training never sees"""


def reached(acc: float, target: float) -> bool:
    """Accuracies are counts over the set: 82/200 = 0.41 reaches 0.21 + 0.2, which floats make
    0.41000000000000003."""
    return acc >= target - 1e-9


def time_to_target(curve: list, target: float, base: float) -> float | None:
    """Training-clock seconds at which accuracy first reached `target`, interpolated linearly
    from the point before it (the base model's accuracy at 0 s for the first); None if it
    never did. curve: [(seconds, step, accuracy), ...] in time order."""
    prev_t, prev_a = 0.0, base
    for t, _, a in curve:
        if reached(a, target):
            if a <= prev_a:  # the point before was as high: no slope to follow
                return t
            return prev_t + (target - prev_a) / (a - prev_a) * (t - prev_t)
        prev_t, prev_a = t, a
    return None


def censored_median(vals: list[float | None]) -> float | None:
    """Median time to target, a run that never reached it counting as longer than any that
    did; None when the median itself is such a run."""
    times = sorted(math.inf if v is None else v for v in vals)
    m = statistics.median(times) if times else math.inf
    return None if math.isinf(m) else m


def report(runs: list[dict], base: float, target: float, args) -> list[str]:
    """Per-run lines, a median line per system, the ratio line last."""
    lines = [machine_line(),
             f"held-out: {SET}, {args.n} problems, greedy; base accuracy {base:.3f}, target "
             f"{target:.3f} (base + {args.gain:.2f}); budget {args.budget_s:.0f} s of training "
             f"per run; seeds {' '.join(map(str, args.seeds))}; ours: cpu-demo preset"
             + (f" + {args.ours_flags}" if args.ours_flags else "")]
    if any(x["system"] == "trl" for x in runs):
        lines.append(f"trl: TRL's {TRL_ENGINES[args.trl_engine]}")
    medians = {}
    for system in ("trl", "ours"):
        mine = [x for x in runs if x["system"] == system]
        if not mine:
            continue
        for x in mine:
            tta = x["tta_s"]
            lines.append(f"{system} seed {x['seed']}: "
                         + (f"target at {tta:.0f} s" if tta is not None
                            else f"target not reached in {x['clock_s']:.0f} s")
                         + f", {x['steps']} steps, last accuracy {x['curve'][-1][2]:.3f}, "
                         f"setup {x['setup_s']:.0f} s; {len(x['curve'])} evaluations, at "
                         f"steps {' '.join(str(step) for _, step, _ in x['curve'])}")
        reached = [x["tta_s"] for x in mine if x["tta_s"] is not None]
        medians[system] = censored_median([x["tta_s"] for x in mine])
        spread = f" (range {min(reached):.0f}-{max(reached):.0f})" if reached else ""
        med = "never reached" if medians[system] is None else f"{medians[system]:.0f} s"
        lines.append(f"{system}: time to target, median {med}{spread}, {len(reached)} of "
                     f"{len(mine)} seeds reached it (a miss counts as longer than any hit)")
    if len(medians) < 2:
        lines.append(f"ratio TRL/ours: n/a (only {', '.join(medians) or 'no system'} run)")
    elif medians.get("ours") and medians.get("trl"):
        lines.append(f"ratio TRL/ours (median time to target): "
                     f"{medians['trl'] / medians['ours']:.2f}")
    elif medians.get("ours"):
        lines.append(f"ratio TRL/ours (median time to target): > "
                     f"{args.budget_s / medians['ours']:.2f} (TRL's median run missed the target)")
    else:
        lines.append("ratio TRL/ours (median time to target): n/a (ours' median run missed "
                     "the target)")
    return lines


def plot(runs: list[dict], target: float, base: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"ours": "tab:blue", "trl": "tab:orange"}
    for x in runs:
        ts = [0.0] + [t for t, _, _ in x["curve"]]
        accs = [100 * base] + [100 * a for _, _, a in x["curve"]]
        ax.plot(ts, accs, marker="o", color=colors[x["system"]], alpha=0.8,
                label=f"{x['system']} seed {x['seed']}")
    ax.axhline(100 * target, color="gray", linestyle="--", label="target")
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel(f"{SET} greedy accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


JOIN_SAME = ("n", "gain", "budget_s", "trl_engine", "ours_flags")
"""settings the runs of joined results must share (the seeds must differ)"""


def load(out_dir: str) -> dict:
    """OUT/results.json of an earlier run; a ValueError naming the path if there is none."""
    path = os.path.join(out_dir, "results.json")
    if not os.path.isfile(path):
        raise ValueError(f"no results.json in {out_dir}")
    with open(path) as f:
        return json.load(f)


def join_results(saved: list[dict]) -> dict:
    """One results.json from several (`--join`): the runs of the same settings and base
    accuracy, seeds in the order given. A difference is a ValueError naming it."""
    first = saved[0]
    for other in saved[1:]:
        for key in JOIN_SAME:
            if other["args"].get(key) != first["args"].get(key):
                raise ValueError(f"--join: {key} differs ({first['args'].get(key)!r} against "
                                 f"{other['args'].get(key)!r})")
        if other["base"] != first["base"]:
            raise ValueError(f"--join: base accuracy differs ({first['base']} against "
                             f"{other['base']}): not the same held-out set or model")
    runs = [x for one in saved for x in one["runs"]]
    pairs = [(x["system"], x["seed"]) for x in runs]
    if len(set(pairs)) < len(pairs):
        raise ValueError("--join: a (system, seed) is in more than one of the results")
    seeds = list(dict.fromkeys(x["seed"] for x in runs))
    return {**first, "args": {**first["args"], "seeds": seeds}, "runs": runs}


def save(args, base: float, target: float, runs: list[dict], lines=()) -> None:
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "base": base, "target": target, "runs": runs,
                   "lines": list(lines)}, f, indent=2)


def finish(args, base: float, target: float, runs: list[dict]) -> list[str]:
    """Times to target from the curves, the report, results.json and the plot."""
    for x in runs:
        x["tta_s"] = time_to_target(x["curve"], target, base)
    lines = report(runs, base, target, args)
    save(args, base, target, runs, lines)
    plot(runs, target, base, os.path.join(args.out, "tta.png"))
    return lines
