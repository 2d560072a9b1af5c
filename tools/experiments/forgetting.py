"""Continual learning: train stages that interfere, score every stage after each one, per method.

    python -m tools.experiments.forgetting                   # naive and replay, 3 seeds: 75 min
    python -m tools.experiments.forgetting --quick           # 1 seed, a smaller check
    python -m tools.experiments.forgetting --ewc-lams 1e2 --methods naive,replay,anchor-kl
                                                             # + EWC and anchor-KL: ~2.5 h
    python -m tools.experiments.forgetting --seeds 0 1 2 --resume        # keep finished runs
    python -m tools.experiments.forgetting --table-only --ewc-lams 1e3   # table the saved runs
    python -m tools.experiments.forgetting --methods naive,replay --seeds 0 --stage-steps 30
    python -m tools.experiments.forgetting --methods naive --ewc-lams 1e2,1e3,1e4 -- \
        --rollout.engine vllm         # after --: launch.train flags for every arm (default: HF)
    python -m tools.experiments.forgetting --preset tiny --stage-steps 1 --n 4 --seeds 0  # smoke

The stages (default `STAGES`; `--styles` orders them) ask for the same kind of problem with a
different reply each (`rewards.styles`): "#### N" after working, then "Answer: N" after working,
then `short`, just the number on one line. The last pulls against both before it: a policy
trained to answer in one short line drops the tagged lines everywhere, so stage 1's tagged
accuracy (right *and* with the asked answer tag; `--metric strict_accuracy`: the tag on the last
line) is what plain sequential training loses, and a method that keeps stage 1 must teach the
policy to tell the prompts apart. A method is a set of `launch.train`
flags (`METHODS`; `--ewc-lams` adds EWC arms on a log grid). For every method and seed: train
the curriculum (a local Ray cluster, the real driver), save the policy after each stage and
score it greedily on every stage's held-out set. Stage 1 is trained once per seed (the arms
differ from stage 2 on) and the seed's other arms branch from its checkpoint at the end of it
(`--separate-stage1`: each trains its own). Writes OUT/results.json (every matrix),
OUT/table.md (mean and range over seeds: final accuracy per stage, ACC, BWT, FWT, stage 1's
gain kept, wall time, peak memory; `tools.experiments.cl_metrics`) and OUT/stages.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

from launch.cli import parse_config
from launch.evaluate.sets import heldout_sets
from launch.rundir.checkpoints import list_checkpoints
from rewards.styles import DEFAULT_STYLE
from rewards.styles import STYLES as ANSWER_STYLES
from tools.experiments.cl_metrics import summarize
from tools.experiments.cl_run import METRICS, SCORES, Stem, run_method, scores

# Measured (docs/history.md): "Answer: N" is the embedded model's own habit and outlasts
# later stages; "#### N" first is learnt a little and the "Answer:" stage lifts it; `short` last
# is learnt from a tagged policy and wipes both tags; `short` first locks the policy into short
# replies (the tagged stages after it learnt nothing).
STYLES = ("hash", "answer", "short")


def stage_design(styles) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(stage specs with an {n} for the steps, held-out set names), one per answer style."""
    suffix = [f":{s}" if s != DEFAULT_STYLE else "" for s in styles]
    return (tuple(f"arith:1:{{n}}{x}" for x in suffix),
            tuple(f"arith-1{x.replace(':', '-')}" for x in suffix))


STAGES, SETS = stage_design(STYLES)  # stage j's spec and its held-out set
NO_REPLAY = ["--curriculum.replay", "0"]  # every arm names its replay: the default is replay
METHODS = {
    "naive": NO_REPLAY,
    "replay": ["--curriculum.replay", "0.25"],
    "anchor-kl": ["--ewc.anchor_kl", "0.1", *NO_REPLAY],
    "replay+anchor-kl": ["--curriculum.replay", "0.25", "--ewc.anchor_kl", "0.1"],
}
BASE_FLAGS = ["--rollout.engine", "hf"]
"""before the train flags: docs/results.md's tables were measured with the HF engine
(cpu-demo's then); `-- --rollout.engine vllm` runs them with vLLM (another design for --resume)"""
DEFAULT_METHODS = "naive,replay"  # 3 seeds: 75 min on 2 vCPUs; each other arm ~35 min more


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools.experiments.forgetting",
                                description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--preset", default="cpu-demo", help="base preset")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help=f"comma-separated, of: {', '.join(METHODS)} (default: "
                        f"{DEFAULT_METHODS}, the baseline and the curriculum's default)")
    p.add_argument("--ewc-lams", default="", help="EWC arms, e.g. 1e2,1e3,1e4 (ewc-<lam>)")
    p.add_argument("--styles", default=",".join(STYLES),
                   help="the stages' answer styles in order, comma-separated, of: "
                        f"{', '.join(ANSWER_STYLES)}")
    p.add_argument("--stage-steps", type=int, default=30, help="training steps per stage")
    p.add_argument("--n", type=int, default=150, help="held-out problems per stage set")
    p.add_argument("--quick", action="store_true",
                   help="a smaller check: seed 0, naive and replay, 20 steps a stage, 60 problems")
    p.add_argument("--metric", default=METRICS[0], choices=METRICS,
                   help="the table's and plot's metric (results.json keeps them all; "
                        "--resume re-tables finished runs without training)")
    p.add_argument("--out", default="runs/forgetting", help="output directory")
    p.add_argument("--resume", action="store_true",
                   help="keep the (method, seed) runs OUT/results.json already holds for the "
                        "same stages, steps, sets and preset; run only the rest (results.json "
                        "keeps the saved runs not asked for too; the table shows those asked)")
    p.add_argument("--table-only", action="store_true",
                   help="no training: table and plot the saved runs of the asked methods "
                        "and --seeds in OUT/results.json (the same design; a method may have "
                        "fewer seeds saved)")
    p.add_argument("--separate-stage1", dest="share_stage1", action="store_false",
                   help="every arm trains its own stage 1 (default: a seed's first arm trains "
                        "it and the others branch from its checkpoint at the end of stage 1)")
    p.add_argument("train_flags", nargs=argparse.REMAINDER,
                   help="-- then launch.train flags for every method (e.g. --rollout.engine vllm)")
    args = p.parse_args(argv)
    if args.train_flags[:1] == ["--"]:
        args.train_flags = args.train_flags[1:]
    if args.quick:
        args.seeds, args.methods, args.stage_steps, args.n = [0], "naive,replay", 20, 60
    methods = {m: METHODS.get(m) for m in args.methods.split(",") if m}
    bad = [m for m, flags in methods.items() if flags is None]
    if bad:
        p.error(f"--methods: {', '.join(bad)}: allowed: {', '.join(METHODS)}")
    for lam in [x for x in args.ewc_lams.split(",") if x]:
        methods[f"ewc-{lam}"] = ["--ewc.lam", lam, *NO_REPLAY]
    args.method_flags = methods
    styles = [x for x in args.styles.split(",") if x]
    bad = [x for x in styles if x not in ANSWER_STYLES]
    if bad or len(set(styles)) != len(styles) or len(styles) < 2:
        p.error(f"--styles: {args.styles!r}: two or more distinct, of: "
                f"{', '.join(ANSWER_STYLES)}")
    args.stages, args.sets = stage_design(styles)
    return args


def method_config(args, flags: list[str], seed: int):
    stages = ",".join(s.format(n=args.stage_steps) for s in args.stages)
    cfg, _ = parse_config(["--preset", args.preset,
                           "--steps", str(len(args.stages) * args.stage_steps),
                           "--curriculum.stages", stages, "--run.checkpoint_every", "0",
                           "--seed", str(seed), *BASE_FLAGS, *args.train_flags, *flags],
                          prog="tools.experiments.forgetting")
    return cfg


def note_stem(stems: dict, args, method: str, run_dir: str, run: dict) -> None:
    """Make `run` its seed's stem if the seed has none yet and it saved one (its checkpoint
    at the end of stage 1 is on disk: a run kept by --resume may have lost it)."""
    seed = run["seed"]
    if (args.share_stage1 and seed not in stems and run.get("stage1_s") is not None
            and not run.get("stage1_from") and list_checkpoints(run_dir)):
        stems[seed] = Stem(method, run_dir, run["after"][0], run["stage1_s"])


def fresh_dir(path: str) -> str:
    """`path`, emptied: a run that is not kept starts again, and the trainer would append its
    rows to an interrupted run's metrics.jsonl."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def same_design(args) -> dict:
    """What must match for a saved run to be reused by --resume."""
    return {"preset": args.preset, "stage_steps": args.stage_steps, "n": args.n,
            "stages": list(args.stages), "sets": list(args.sets),
            "train_flags": list(args.train_flags),
            "scores": list(SCORES), "format_levels": [1.0, 0.5, 0.25, 0.0],
            # runs that share stage 1 are not mixed with runs that each trained their own
            # (results saved before the key existed are the latter)
            **({"stage1": "shared"} if args.share_stage1 else {})}


def read_saved(path: str) -> dict | None:
    """results.json at `path`, or None when it is missing or torn (a kill mid-write)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def finished_runs(path: str, design: dict) -> dict[str, list[dict]]:
    """{method: [run, ...]} saved in results.json at `path` by an experiment of the same
    design; {} when there is none or it was another design (it is then not reused)."""
    saved = read_saved(path) or {}
    return saved.get("results", {}) if saved.get("design") == design else {}


def kept_with(results: dict, done: dict) -> dict[str, list[dict]]:
    """What results.json holds: this invocation's runs, plus the saved runs of the same design
    it did not ask for (another method or seed), so a --resume over a subset loses none."""
    out = {m: list(rs) for m, rs in results.items()}
    for m, rs in done.items():
        seeds = {r["seed"] for r in out.get(m, [])}
        out.setdefault(m, []).extend(r for r in rs if r["seed"] not in seeds)
    return {m: sorted(rs, key=lambda r: r["seed"]) for m, rs in out.items()}


def matrix(run: dict, metric: str, sets=SETS) -> list[list[float]]:
    """R[i][j]: `metric` on stage j's set (`sets[j]`) after training stage i."""
    return [[a[s][metric] for s in sets] for a in run["after"]]


def mean_range(vals: list[float], scale: float = 100.0, fmt: str = "{:.1f}") -> str:
    vals = [v for v in vals if v == v]  # nan: stage 1 gained nothing, so no share was kept
    if not vals:
        return "n/a"
    m, lo, hi = (scale * statistics.mean(vals), scale * min(vals), scale * max(vals))
    return f"{fmt.format(m)} ({fmt.format(lo)} to {fmt.format(hi)})" if len(vals) > 1 \
        else fmt.format(m)


def table(base: dict, results: dict, metric: str, sets=SETS) -> str:
    """Markdown: one row per method, mean (range) over seeds, in points of `metric`."""
    b = [base[s][metric] for s in sets]
    head = ["method", "seeds", *(f"final {s}" for s in sets), "ACC", "BWT", "FWT",
            "stage-1 lost", "stage-1 gain kept", "wall min", "peak GiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append("| base | - | " + " | ".join(f"{100 * x:.1f}" for x in b)
                 + " | - | - | - | - | - | - | - |")
    for name, runs in results.items():
        cl = [summarize(matrix(r, metric, sets), b) for r in runs]
        finals = [mean_range([matrix(r, metric, sets)[-1][j] for r in runs])
                  for j in range(len(sets))]
        cells = [name, str(len(runs)), *finals,
                 mean_range([c.acc for c in cl]), mean_range([c.bwt for c in cl]),
                 mean_range([c.fwt for c in cl]), mean_range([c.forgot_first for c in cl]),
                 mean_range([c.kept for c in cl], fmt="{:.0f}%"),
                 mean_range([r["wall_s"] / 60 for r in runs], 1.0),
                 mean_range([r["peak_pss_gb"] for r in runs], 1.0, "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(base: dict, results: dict, path: str, metric: str, sets=SETS) -> None:
    """One panel per method: each stage set's `metric` at base and after each stage
    (mean over seeds, the seeds' range shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.4), squeeze=False)
    x = list(range(len(sets) + 1))
    for ax, (name, runs) in zip(axes[0], results.items()):
        for j, s in enumerate(sets):
            ys = [[base[s][metric]] + [row[j] for row in matrix(r, metric, sets)] for r in runs]
            mean = [100 * statistics.mean(v) for v in zip(*ys)]
            ax.plot(x, mean, marker="o", label=s)
            ax.fill_between(x, [100 * min(v) for v in zip(*ys)],
                            [100 * max(v) for v in zip(*ys)], alpha=0.2)
        ax.set_title(f"{name} ({len(runs)} seed(s))")
        ax.set_xticks(x, ["base", *(f"after {i + 1}" for i in range(len(sets)))])
        ax.set_ylim(0, 100)
        ax.set_ylabel(f"{metric} %")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def saved_table(path: str, design: dict, methods, seeds) -> tuple[dict, dict]:
    """(base scores, {method: runs}) that results.json at `path` holds for `design`: the saved
    runs of the asked methods and seeds (--table-only); a missing file or another design exits."""
    saved = read_saved(path)
    if saved is None:
        raise SystemExit(f"forgetting: --table-only: no readable {path} (missing or torn)")
    if saved.get("design") != design:
        raise SystemExit(f"forgetting: --table-only: {path} holds another design (stages, "
                         "steps, sets, preset or train flags differ); nothing to table")
    runs = {m: [r for r in saved["results"].get(m, []) if r["seed"] in seeds] for m in methods}
    runs = {m: rs for m, rs in runs.items() if rs}
    if not runs:
        raise SystemExit(f"forgetting: --table-only: {path} has no runs of "
                         f"{', '.join(methods)} with seeds {seeds}; saved: "
                         f"{', '.join(saved['results'])}")
    return saved["base"], runs


def report(args, base: dict, results: dict, wall_s: float | None) -> None:
    """OUT/table.md and OUT/stages.png of `results`, and the table on stdout."""
    md = table(base, results, args.metric, args.sets)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(md + "\n")
    plot(base, results, os.path.join(args.out, "stages.png"), args.metric, args.sets)
    seeds = sorted({r["seed"] for runs in results.values() for r in runs})
    wall = f"wall {wall_s / 60:.1f} min" if wall_s is not None else "saved runs, no training"
    print(f"\nforgetting: {args.preset}, {len(args.stages)} x {args.stage_steps} steps, "
          f"{args.n} held-out problems per stage, seeds {seeds}, {wall}; "
          f"{args.out}/table.md, stages.png")
    print(md)


def main(argv=None) -> int:
    args = parse_args(argv)
    design, out_json = same_design(args), os.path.join(args.out, "results.json")
    if args.table_only:
        report(args, *saved_table(out_json, design, list(args.method_flags), args.seeds), None)
        return 0
    os.makedirs(args.out, exist_ok=True)
    cfg0 = method_config(args, [], args.seeds[0])
    sets = heldout_sets(",".join(args.sets), args.n, None)
    base = scores(cfg0.model.name, sets, cfg0.rollout.max_new_tokens)
    done = finished_runs(out_json, design) if args.resume else {}
    results: dict[str, list[dict]] = {}
    stems: dict[int, Stem] = {}  # seed -> its shared stage 1 (--separate-stage1: none)
    t0 = time.perf_counter()
    for name, flags in args.method_flags.items():
        for seed in args.seeds:
            kept = [r for r in done.get(name, []) if r["seed"] == seed]
            if kept:
                print(f"{name} seed {seed}: kept from {out_json}", flush=True)
                results.setdefault(name, []).append(kept[0])
                note_stem(stems, args, name, os.path.join(args.out, name, f"seed{seed}"),
                          kept[0])
                continue
            cfg, run_dir = method_config(args, flags, seed), os.path.join(args.out, name,
                                                                        f"seed{seed}")
            run = run_method(cfg, fresh_dir(run_dir), sets, stems.get(seed),
                             save_stem=args.share_stage1 and seed not in stems)
            results.setdefault(name, []).append({"seed": seed, **run})
            note_stem(stems, args, name, run_dir, results[name][-1])
            # written after every run: an interrupted experiment keeps what it finished
            with open(out_json, "w") as f:
                json.dump({"args": vars(args), "design": design, "stages": args.stages,
                           "sets": args.sets, "metric": args.metric, "base": base,
                           "results": kept_with(results, done)}, f, indent=2)
            R = matrix(results[name][-1], args.metric, args.sets)
            print(f"{name} seed {seed}: {args.metric} after each stage (rows) on "
                  f"{', '.join(args.sets)}: "
                  f"{[[round(100 * x, 1) for x in row] for row in R]}", flush=True)
    report(args, base, results, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
