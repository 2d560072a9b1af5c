"""TRL's batches, step by step, through ours' learner: do K updates of each end in one place?

    python -m tools.compare.replay_trl                 # seeds 0 1 2, 4 steps each
    python -m tools.compare.replay_trl --seeds 0 --steps 8

For each seed, TRL's GRPOTrainer (time_to_accuracy's GRPOConfig, transformers' generate)
trains `--steps` steps as in the time-to-accuracy race; every batch it generates (prompts,
completions, advantages) and its LoRA weights after every step are kept. Then ours' learner
(`Learner.train_on`, the cpu-demo preset) starts from TRL's LoRA initialisation and takes the
same batches in the same order, its behaviour log-probs its own (on-policy, as TRL's are).
Prints, per step, the cosine between the two runs' total moves (weights - initial weights) and
their norms. tools.compare.one_update shows one update is the same; this carries it over
several, so the optimizers' state (AdamW's moments, steps on batches with no reward spread)
is compared too.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from transformers import TrainerCallback

from common.models import load_tokenizer, resolve_model
from common.presets import get_preset
from common.types import TrainBatch
from learner.learner import Learner
from tasks.prompts import format_prompt
from tasks.registry import make_task
from tools.compare.one_update import Batch, _cos, _flat, behaviour_logp
from tools.compare.settings import machine_line, trl_trainer
from tools.compare.time_to_accuracy import trl_args, trl_reward


def unpad(out: dict) -> Batch:
    """A TRL generation batch (prompts padded left, completions right) as ours takes it."""
    pm, cm = out["prompt_mask"].bool(), out["completion_mask"].bool()
    prompts = [row[m].tolist() for row, m in zip(out["prompt_ids"], pm)]
    comps = [row[m].tolist() for row, m in zip(out["completion_ids"], cm)]
    return Batch(prompts, comps, out["advantages"].float().numpy().copy())


def trainable(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def record_trl(cfg, seed: int, steps: int, work: str,
               reward=None) -> tuple[dict, list[Batch], list[dict]]:
    """TRL trains `steps` steps (with `reward`, TRL's signature; default ours, `trl_reward`):
    (its initial trainable tensors, the batches it trained on, its trainable tensors after
    each step)."""
    path = resolve_model(cfg.model.name)
    tok = load_tokenizer(path)
    task = make_task("arith", 1, None, seed)
    rows = [{"prompt": format_prompt(tok, p["question"]), "answer": p["answer"]}
            for p in (task.train_sample(i) for i in range(4000))]
    args = trl_args(cfg, work, seed, "hf")
    args.max_steps = steps
    after: list[dict] = []

    class Keep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            after.append(trainable(model))

    trainer = trl_trainer(path, tok, rows, reward or trl_reward(cfg.rollout.format_weight), args,
                          cfg.lora.r, cfg.lora.alpha, Keep())
    init, batches = trainable(trainer.model), []
    generate = trainer._generate_and_score_completions

    def kept(*a, **k):
        out = generate(*a, **k)
        batches.append(unpad(out))
        return out

    trainer._generate_and_score_completions = kept
    trainer.train()
    return init, batches, after


def replay_ours(cfg, init: dict, batches: list[Batch]) -> list[dict]:
    """Ours' learner from `init` on `batches` in order: its trainable tensors after each."""
    learner = Learner(cfg)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if set(learner.params) != set(init):
        raise RuntimeError("TRL's trainable tensors are not ours' (LoRA targets differ)")
    with torch.no_grad():
        for n, p in learner.params.items():
            p.copy_(init[n])
    out = []
    for b in batches:
        old = behaviour_logp(learner.model, b, cfg.rollout.temperature)
        ones = [np.ones(len(c), np.float32) for c in b.completion_ids]  # rho 1: unused
        learner.train_on(TrainBatch(b.prompt_ids, b.completion_ids, old, ones,
                                    b.advantages.astype(np.float32)))
        out.append({n: p.detach().clone() for n, p in learner.params.items()})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    print(machine_line(), flush=True)
    for seed in args.seeds:
        cfg = get_preset("cpu-demo")
        cfg.run.seed = seed
        with tempfile.TemporaryDirectory() as work:
            init, batches, trl_after = record_trl(cfg, seed, args.steps, work)
        ours_after = replay_ours(cfg, init, batches)
        names = sorted(init)
        start = _flat(init, names)
        for k, (b, t, o) in enumerate(zip(batches, trl_after, ours_after), 1):
            dt, do = _flat(t, names) - start, _flat(o, names) - start
            spread = int((np.abs(b.advantages.reshape(-1, cfg.rollout.group_size)) > 0)
                         .any(1).sum())
            print(f"seed {seed} step {k}: groups with spread {spread}; move norm ours "
                  f"{float(do.norm()):.6f} trl {float(dt.norm()):.6f}; cosine {_cos(do, dt):.6f}"
                  f"; relative difference {float((do - dt).norm() / dt.norm()):.2e}", flush=True)


if __name__ == "__main__":
    main()
