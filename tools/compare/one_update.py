"""One identical batch through TRL's GRPO update and ours: is a step of either worth more?

    python -m tools.compare.one_update              # cpu-demo's model and settings, seeds 0 1 2
    python -m tools.compare.one_update --seeds 0    # one batch

For each seed: the base model samples 2 prompts x G completions (transformers' `generate`, the
preset's temperature and length), our reward scores them and ours' group advantages are taken.
Then, from the same LoRA initialisation, ours' learner (`Learner.train_on`, the cpu-demo preset)
and TRL's `GRPOTrainer._compute_loss` (the GRPOConfig of `tools.compare.time_to_accuracy`:
DAPO loss, its defaults) each take one update on that batch. Prints both losses and gradient
norms, the cosine between the two gradients (after the 1.0 norm clip both apply) and between
the two AdamW steps. A cosine of 1 and equal norms mean one update moves the policy the same way
by the same amount, so any difference in learning per update lies in what is sampled.
TRL generates with `generate` here (`use_vllm=False`): with vLLM it multiplies the loss by an
importance ratio to its engine's log-probs, which is 1 on an exactly synced engine.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from transformers import TrainerCallback

from common.models import load_model, load_tokenizer, resolve_model
from common.presets import get_preset
from common.types import TrainBatch
from learner.advantages import group_advantages
from learner.learner import Learner
from tasks.prompts import format_prompt
from tasks.registry import make_task
from tools.compare.settings import machine_line, trl_trainer
from tools.compare.time_to_accuracy import trl_args, trl_reward


@dataclass
class Batch:
    """N = prompts x G sampled sequences, as both updates take them."""

    prompt_ids: list[list[int]]
    """(N, P_i) prompt token ids"""
    completion_ids: list[list[int]]
    """(N, T_i) completion token ids, the EOS token included where it stopped"""
    advantages: np.ndarray
    """(N,) group-relative advantages"""


@dataclass
class Comparison:
    """One update each on the same batch from the same weights."""

    loss_ours: float
    loss_trl: float
    grad_norm_ours: float
    """before clipping"""
    grad_norm_trl: float
    grad_cos: float
    """cosine between the clipped gradients over every trainable tensor"""
    step_norm_ours: float
    """norm of the AdamW step (new - old trainable weights)"""
    step_norm_trl: float
    step_cos: float


@torch.no_grad()
def behaviour_logp(model, batch: Batch, temperature: float) -> list[np.ndarray]:
    """(N, T_i) log-probs of each completion token under `model` at `temperature`: the
    behaviour log-probs of an on-policy batch."""
    out = []
    for p, c in zip(batch.prompt_ids, batch.completion_ids):
        logits = model(torch.tensor([p + c])).logits[0, len(p) - 1: -1].float()   # (T, V)
        logp = torch.log_softmax(logits / temperature, -1)
        out.append(logp.gather(-1, torch.tensor(c)[:, None])[:, 0].numpy())
    return out


def ours_update(cfg, batch: Batch) -> tuple[dict, dict, dict, object]:
    """One update of ours' learner (a plain Learner of `cfg`) on `batch`: (initial trainable
    tensors, clipped gradients, step, LearnerStep)."""
    learner = Learner(cfg)
    init = {n: p.detach().clone() for n, p in learner.params.items()}
    grads, step = {}, learner.opt.step

    def capture(*a, **k):  # the gradients as the optimizer sees them (clipped)
        grads.update({n: p.grad.detach().clone() for n, p in learner.params.items()})
        return step(*a, **k)

    learner.opt.step = capture
    old = behaviour_logp(learner.model, batch, cfg.rollout.temperature)
    ones = [np.ones(len(c), np.float32) for c in batch.completion_ids]  # rho 1: unused
    stats = learner.train_on(TrainBatch(batch.prompt_ids, batch.completion_ids, old, ones,
                                        batch.advantages.astype(np.float32)))
    moved = {n: p.detach() - init[n] for n, p in learner.params.items()}
    return init, grads, moved, stats


def trl_update(cfg, path: str, tok, batch: Batch, init: dict, work: str):
    """TRL's GRPOTrainer (time_to_accuracy's GRPOConfig, generate) from the trainable tensors
    `init`, after one update on `batch`: (loss, grad norm, clipped gradients, step)."""
    args = trl_args(cfg, work, cfg.run.seed, "hf")
    rows = [{"prompt": "x", "answer": "0"}] * 8  # not sampled from: the batch comes in whole
    trainer = trl_trainer(path, tok, rows, trl_reward(cfg.rollout.format_weight), args,
                          cfg.lora.r, cfg.lora.alpha, TrainerCallback())
    model = trainer.model
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(params) != set(init):
        raise RuntimeError("TRL's trainable tensors are not ours' (LoRA targets differ)")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(init[n])
    pad, P = tok.pad_token_id, max(map(len, batch.prompt_ids))
    T = max(map(len, batch.completion_ids))
    inputs = {  # TRL's layout: prompts padded on the left, completions on the right
        "prompt_ids": torch.tensor([[pad] * (P - len(p)) + p for p in batch.prompt_ids]),
        "prompt_mask": torch.tensor([[0] * (P - len(p)) + [1] * len(p)
                                     for p in batch.prompt_ids]),
        "completion_ids": torch.tensor([c + [pad] * (T - len(c)) for c in batch.completion_ids]),
        "completion_mask": torch.tensor([[1] * len(c) + [0] * (T - len(c))
                                         for c in batch.completion_ids]),
        "advantages": torch.tensor(batch.advantages, dtype=torch.float32),
    }
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum().float()
    trainer.current_gradient_accumulation_steps = 1  # what training_step sets
    model.train()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(params.values()), args.max_grad_norm)
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    trainer.create_optimizer()
    trainer.optimizer.step()
    moved = {n: p.detach() - init[n] for n, p in params.items()}
    return float(loss.detach()), float(norm), grads, moved


def _flat(tensors: dict, names: list[str]) -> torch.Tensor:
    return torch.cat([tensors[n].flatten().double() for n in names])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()).clamp(min=1e-30))


def compare(cfg, path: str, tok, batch: Batch, work: str) -> Comparison:
    """Both updates on `batch` from one LoRA initialisation (ours' learner's, seed cfg.run.seed)."""
    init, g_ours, d_ours, stats = ours_update(cfg, batch)
    loss_trl, norm_trl, g_trl, d_trl = trl_update(cfg, path, tok, batch, init, work)
    names = sorted(init)
    go, gt, do, dt = (_flat(x, names) for x in (g_ours, g_trl, d_ours, d_trl))
    return Comparison(stats.loss_policy, loss_trl, stats.grad_norm, norm_trl, _cos(go, gt),
                      float(do.norm()), float(dt.norm()), _cos(do, dt))


@torch.no_grad()
def sample(model, tok, problems: list[dict], cfg) -> tuple[Batch, np.ndarray]:
    """G completions of each problem from `model` at cfg's temperature and length: (the
    batch with ours' group advantages, its (N,) rewards)."""
    r = cfg.rollout
    prompt_ids, comps = [], []
    for p in problems:
        ids = tok(format_prompt(tok, p["question"]), add_special_tokens=False,
                  return_tensors="pt").input_ids                                 # (1, P)
        rows = ids.repeat(r.group_size, 1)                                      # (G, P)
        out = model.generate(input_ids=rows, attention_mask=torch.ones_like(rows),
                             do_sample=True, temperature=r.temperature, top_k=0, top_p=1.0,
                             max_new_tokens=r.max_new_tokens, use_cache=True,
                             pad_token_id=tok.pad_token_id)                      # (G, P + T)
        for row in out[:, ids.shape[1]:].tolist():
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
            prompt_ids.append(ids[0].tolist())
            comps.append(row)
    texts = tok.batch_decode(comps, skip_special_tokens=True)
    answers = [p["answer"] for p in problems for _ in range(r.group_size)]
    rewards = np.array(trl_reward(r.format_weight)(None, texts, answers), np.float32)
    adv = group_advantages(rewards.reshape(-1, r.group_size)).reshape(-1)
    return Batch(prompt_ids, comps, adv), rewards


def sample_batch(cfg, path: str, tok, seed: int) -> tuple[Batch, np.ndarray]:
    """cfg's prompts_per_step training prompts of arithmetic level 1 (seed `seed`), G
    completions each from the base model: (the batch, its (N,) rewards)."""
    task = make_task("arith", 1, None, seed)
    problems = [task.train_sample(i) for i in range(cfg.rollout.prompts_per_step)]
    model = load_model(path, torch.float32)
    torch.manual_seed(seed)
    return sample(model, tok, problems, cfg)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args(argv)
    print(machine_line(), flush=True)
    for seed in args.seeds:
        cfg = get_preset("cpu-demo")
        cfg.run.seed = seed
        path = resolve_model(cfg.model.name)
        tok = load_tokenizer(path)
        batch, rewards = sample_batch(cfg, path, tok, seed)
        with tempfile.TemporaryDirectory() as work:
            c = compare(cfg, path, tok, batch, work)
        print(f"seed {seed}: rewards {rewards.tolist()}; completion tokens "
              f"{sum(map(len, batch.completion_ids))}", flush=True)
        print(f"  loss ours {c.loss_ours:.6f} trl {c.loss_trl:.6f}; grad norm ours "
              f"{c.grad_norm_ours:.6f} trl {c.grad_norm_trl:.6f}; grad cosine {c.grad_cos:.6f}; "
              f"step norm ours {c.step_norm_ours:.6f} trl {c.step_norm_trl:.6f}; step cosine "
              f"{c.step_cos:.6f}", flush=True)


if __name__ == "__main__":
    main()
