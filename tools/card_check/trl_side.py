"""TRL's side of the card check: `trl.GRPOTrainer` (no vLLM) in a process of its own.

`spawn_trl(spec)` starts one process for it, so TRL's peak is its own (not the driver's, not
ours'), and on CUDA it holds the whole cap as one process (torch's per-process memory
fraction, `common.device.cap_process_memory`) while the driver holds no CUDA context.

TRL runs `GRPOConfig`'s defaults (TRL 1.16: beta 0, DAPO loss, one iteration, gradient
checkpointing on, `per_device_train_batch_size` 8) with only what makes its step the same step
as ours changed: the learning rate, G (`num_generations`), the completion length forced with
`generation_kwargs={"min_new_tokens": ...}` (random weights would otherwise stop at a sampled
EOS), LoRA through a `peft.LoraConfig` on the same modules, the same compute dtype for the
frozen base (`model_init_kwargs`: TRL would load fp32 weights under bf16 autocast by default,
twice the bytes of ours), NF4 through the trainer's `quantization_config` for the QLoRA pair,
and `gradient_accumulation_steps` so that one optimizer step uses G x prompts completions, one
generation, as ours does (`steps_per_generation` defaults to the accumulation steps).
The prompts are text made of whole-word tokens that TRL's own tokenizer call turns into exactly
`prompt_tokens` ids; the reward is random (throughput and memory only).
The peft model's LoRA tensors are copied to the host before `trainer.train()` and compared with
them after it (`lora_changed`, `lora_max_abs_change`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import sys
import tempfile
import time

from common.device import cap_process_memory
from common.models import load_tokenizer
from common.quant import nf4_config
from tools.card_check.meters import Meter, lora_change, lora_snapshot

GiB = 2**30
TRL_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def forced_prompts(tok, n: int, tokens: int, seed: int) -> list[str]:
    """`n` prompts that `tok(text=...)` (TRL's call for plain-text prompts) turns into exactly
    `tokens` ids each: random lower-case words that are single vocabulary tokens."""
    words = sorted(w[1:] for w in tok.get_vocab() if w.startswith("\u0120") and w[1:].isalpha()
                   and w[1:].islower() and 3 <= len(w) <= 8)  # "\u0120": byte-level BPE's space
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        for _ in range(20):  # a pair of words that merges, a special token added: draw again
            text = "".join(" " + rng.choice(words) for _ in range(tokens))
            if len(tok(text=[text])["input_ids"][0]) == tokens:
                out.append(text)
                break
        else:
            raise ValueError(f"no text of exactly {tokens} tokens from this tokenizer's words")
    return out


def micro_batch(completions: int, default: int) -> int:
    """TRL's per-device batch: its default, or the largest divisor of a step's completions
    under it (a generation batch must split into whole micro-batches)."""
    return max(d for d in range(1, min(default, completions) + 1) if completions % d == 0)


def trl_config(spec: dict, out_dir: str):
    """GRPOConfig: TRL's defaults plus the fields named in the module docstring."""
    import trl

    completions = spec["group"] * spec["prompts"]
    mb = spec["micro_batch"] or micro_batch(
        completions, trl.GRPOConfig.__dataclass_fields__["per_device_train_batch_size"].default)
    dtype = spec["dtype"]
    return trl.GRPOConfig(
        output_dir=out_dir, learning_rate=spec["lr"], num_generations=spec["group"],
        max_completion_length=spec["new_tokens"],
        generation_kwargs={"min_new_tokens": spec["new_tokens"]},
        per_device_train_batch_size=mb, gradient_accumulation_steps=completions // mb,
        gradient_checkpointing=True, model_init_kwargs={"dtype": TRL_DTYPES[dtype]},
        bf16=dtype == "bf16", fp16=dtype == "fp16", use_cpu=spec["device"] == "cpu",
        max_steps=spec["warmup"] + spec["steps"], save_strategy="no", report_to="none",
        disable_tqdm=True, seed=spec["seed"])


def _timer():
    """A TrainerCallback that marks each optimizer step's end (the first mark: step 1's
    begin), so step i's time is marks[i + 1] - marks[i]: generation, loss and update."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.marks: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            if not self.marks:
                self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

    return StepTimer()


def hide_vllm() -> None:
    """TRL imports vLLM whenever it is installed (and vLLM imports Ray), even with
    use_vllm=False; hidden (`import vllm` fails, `find_spec` answers None), TRL runs as on a
    machine without it and its process holds neither."""
    sys.modules.setdefault("vllm", None)


def run_trl(spec: dict) -> dict:
    """Build TRL's trainer on `spec["path"]`, train warm-up + timed steps, measure them."""
    hide_vllm()
    import datasets
    import peft
    import torch
    import trl
    from transformers import PrinterCallback, ProgressCallback

    device = spec["device"]
    if device == "cuda":
        cap_process_memory(spec["gpu_gb"])  # the whole cap, one process
    else:
        torch.set_num_threads(spec["threads"])
    meter = Meter(device)
    tok = load_tokenizer(spec["path"])
    n = spec["prompts"] * (spec["warmup"] + spec["steps"])
    if spec.get("prompt_texts"):  # given (tools.card_check): each step the same prompts
        given = spec["prompt_texts"]
        rows = [given[i % len(given)] for i in range(n)]
    else:
        rows = forced_prompts(tok, n, spec["prompt_tokens"], spec["seed"])
    lengths: list[list[int]] = []  # completion lengths per reward call (one call per step)
    rng = random.Random(spec["seed"])

    def random_reward(prompts, completions, completion_ids, **kwargs):
        lengths.append([len(c) for c in completion_ids])
        return [rng.random() for _ in completions]

    lora = peft.LoraConfig(r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0,
                           target_modules=spec["lora_modules"], task_type="CAUSAL_LM")
    quant = nf4_config(getattr(torch, TRL_DTYPES[spec["dtype"]])) if spec["nf4"] else None
    timer = _timer()
    with tempfile.TemporaryDirectory(prefix="homerl-bench-gpu-trl-") as out:
        args = trl_config(spec, out)
        trainer = trl.GRPOTrainer(
            model=spec["path"], reward_funcs=random_reward, args=args,
            train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in rows]),
            processing_class=tok, peft_config=lora, quantization_config=quant,
            callbacks=[timer])
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        before = lora_snapshot(trainer.model.named_parameters())  # the peft model's, on the host
        trainer.train()
        changed = lora_change(before, trainer.model.named_parameters())
    step_s = [b - a for a, b in zip(timer.marks, timer.marks[1:])]
    return {"pid": os.getpid(), "step_s": step_s, "completion_lengths": lengths,
            "prompt_lengths": [len(x) for x in tok(text=rows)["input_ids"]],
            "peak_gb": meter.peak() / GiB, "micro_batch": args.per_device_train_batch_size,
            "grad_accum": args.gradient_accumulation_steps,
            "gradient_checkpointing": args.gradient_checkpointing,
            "loaded_4bit": bool(getattr(trainer.model, "is_loaded_in_4bit", False)),
            "imported": sorted(m for m in ("ray", "vllm") if sys.modules.get(m) is not None)
            } | changed


def _child(conn, spec: dict) -> None:
    try:
        conn.send(run_trl(spec))
    except BaseException as err:  # noqa: BLE001 - an OOM at the cap is a result to report
        conn.send({"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                   if str(err) else type(err).__name__, "pid": os.getpid()})


def spawn_trl(spec: dict, timeout_s: float | None = None) -> dict:
    """Run `run_trl(spec)` in a fresh process; its figures, or {"error": ...}."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, spec), daemon=True)
    proc.start()
    child.close()  # the child's end lives in the child only: its death reads as EOF here
    try:
        if not parent.poll(timeout_s):
            return {"error": f"no answer within {timeout_s:g} s"}
        return parent.recv()
    except EOFError:
        proc.join(timeout=60)
        return {"error": f"TRL's process died (exit code {proc.exitcode})"}
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
