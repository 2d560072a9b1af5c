"""Decoding for evaluation (greedy, and k samples per question for pass@k), in process or as
Ray actors that each take a shard.

`launch.evaluate` uses `greedy_complete` directly on one machine, and `EvalWorker` actors (one
per `--workers`, named `eval:<i>` in the dashboard) when a Ray cluster is up:

    RAY_ADDRESS=127.0.0.1:6379 python -m launch.evaluate --model runs/<run>/final --n 500
"""

from __future__ import annotations

import json
import os
import sys

import ray
import torch
from tqdm import tqdm

from actors.sampling import own_generation
from common.models import load_model, load_tokenizer, resolve_model
from tasks.prompts import INSTRUCTION, format_prompt, prompt_text


def load_for_eval(name_or_path: str, dtype: torch.dtype):
    """(model, tokenizer); a run's LoRA `final/` is loaded onto its base and merged."""
    meta = os.path.join(name_or_path, "homerl.json")
    if os.path.exists(meta):
        with open(meta) as f:
            info = json.load(f)
        if info["kind"] == "adapter":
            from peft import PeftModel

            base_path = resolve_model(info["base_model"])
            base = load_model(base_path, dtype=dtype)
            model = PeftModel.from_pretrained(base, name_or_path).merge_and_unload()
            return model.eval(), load_tokenizer(base_path)
    path = resolve_model(name_or_path)
    return load_model(path, dtype=dtype).eval(), load_tokenizer(path)


def chat_prompts(tokenizer, items: list[dict] | list[str],
                 instructions: list[str] | None = None) -> list[str]:
    """The prompt of each item: a sample (a dict) as training builds it (`prompt_text`: chat
    template, system message, its instruction); a question (a str) chat-formatted with its
    instruction (None: the default answer line)."""
    asks = instructions or [INSTRUCTION] * len(items)
    return [prompt_text(tokenizer, x) if isinstance(x, dict) else format_prompt(tokenizer, x, i)
            for x, i in zip(items, asks)]


@torch.no_grad()
def greedy_complete(model, tokenizer, questions: list[dict] | list[str], max_new_tokens: int,
                    batch_size: int = 32, desc: str = "eval", progress: bool = True,
                    instructions: list[str] | None = None) -> list[str]:
    """Greedy completions for samples or questions (`chat_prompts`), batched, with a progress
    bar.

    Greedy on the model's plain distribution: the generation config is ours
    (actors/sampling.py), so a repetition penalty in the checkpoint's own config does not apply.
    """
    config = own_generation(model, tokenizer, max_new_tokens, greedy=True)
    prompts = chat_prompts(tokenizer, questions, instructions)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
    out: list[str] = [""] * len(prompts)
    starts = range(0, len(order), batch_size)
    for s in tqdm(starts, desc=desc, unit="batch", file=sys.stderr, disable=not progress):
        idx = order[s: s + batch_size]
        enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        gen = model.generate(**enc, generation_config=config)
        texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for i, t in zip(idx, texts):
            out[i] = t
    return out


@torch.no_grad()
def sample_complete(model, tokenizer, questions: list[dict] | list[str], max_new_tokens: int,
                    k: int, seed: int = 0, batch_size: int = 32, desc: str = "sample",
                    progress: bool = True, instructions: list[str] | None = None
                    ) -> list[list[str]]:
    """k completions per sample or question (`chat_prompts`) sampled at temperature 1 from the
    model's plain distribution (our generation config: no top-k/top-p, no penalties), batched;
    seeded per batch."""
    config = own_generation(model, tokenizer, max_new_tokens, greedy=False)
    config.num_return_sequences = k
    prompts = chat_prompts(tokenizer, questions, instructions)
    per_batch = max(1, batch_size // k)
    out: list[list[str]] = []
    starts = range(0, len(prompts), per_batch)
    for s in tqdm(starts, desc=desc, unit="batch", file=sys.stderr, disable=not progress):
        enc = tokenizer(prompts[s: s + per_batch], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        torch.manual_seed(seed * 1_000_003 + s)
        gen = model.generate(**enc, generation_config=config)                   # (b*k, L)
        texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:],
                                       skip_special_tokens=True)
        out += [texts[i * k: (i + 1) * k] for i in range(len(texts) // k)]
    return out


def completion_tokens(tokenizer, texts: list[str]) -> list[int]:
    """Token count of each completion (re-tokenised, as a user would count it)."""
    return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


@ray.remote(num_cpus=1)
class EvalWorker:
    """One model replica; `complete` decodes one shard of a held-out set greedily."""

    def __init__(self, model: str, dtype: str, threads: int):
        torch.set_num_threads(threads)
        self.model, self.tokenizer = load_for_eval(model, getattr(torch, dtype))

    def complete(self, questions: list[dict] | list[str], max_new_tokens: int, batch_size: int,
                 instructions: list[str] | None = None) -> tuple[list[str], list[int]]:
        """(completions, their token counts), in the order of `questions` (samples or
        questions, see `chat_prompts`)."""
        texts = greedy_complete(self.model, self.tokenizer, questions, max_new_tokens,
                                batch_size, progress=False, instructions=instructions)
        return texts, completion_tokens(self.tokenizer, texts)

    def sample(self, questions: list[dict] | list[str], max_new_tokens: int, k: int, seed: int,
               batch_size: int, instructions: list[str] | None = None) -> list[list[str]]:
        """k sampled completions per question (see `sample_complete`)."""
        return sample_complete(self.model, self.tokenizer, questions, max_new_tokens, k, seed,
                               batch_size, progress=False, instructions=instructions)

    def ping(self) -> dict:
        return {"pid": os.getpid(), "threads": torch.get_num_threads()}
