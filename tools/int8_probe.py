"""int8 rollouts on the CPU, measured: what each form of int8 gives the HF engine's decode, and
how far it moves the sampled distribution from the fp32 policy the learner scores.

    python -m tools.int8_probe                      # the embedded model, 16 rows, 1 thread
    python -m tools.int8_probe --batch 8 --new-tokens 32 --json int8.json

1. Dynamic int8 (torch's `quantize_dynamic`: int8 weights per output channel, each call's
   activations quantised per tensor) of a chosen set of linear layers (`ARMS`): the seconds
   to quantise a copy (a rollout worker would pay it at every weight push), the decode step
   at --batch rows (`tools.decode_profile`'s fixed-length method), and the mean per-token
   KL(fp32 || int8) over two prompts' tokens, in nats: the off-policy gap the learner's
   importance ratio would have to correct (`policy/logp_diff` is its sampled estimate).
2. Weight-only int8 (`torch._weight_int8pack_mm`, int8 weights with a per-channel scale, the
   activations unquantised): per distinct linear shape of the model, one matmul at 1 and at
   --batch rows against fp32 `F.linear`, with fp32 and with bf16 activations.

torch.ao's dynamic quantisation is deprecated upstream (a warning at every call); this tool is
the only code that touches it, and nothing in the training path does.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
import torch.nn.functional as F

from common.models import resolve_model
from tools.decode_profile import HFEngine, decode_step, prompt_ids

ARMS = {
    "all linears": lambda name: True,
    "no lm_head, no down_proj": lambda name: name != "lm_head" and "down_proj" not in name,
    "attention only": lambda name: "self_attn" in name,
}
"""which nn.Linear layers (by module name) each dynamic-int8 arm quantises"""


def token_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean over positions of KL(softmax(ref) || softmax(logits)), nats; both (T, V)."""
    ref, other = ref_logits.log_softmax(-1), logits.log_softmax(-1)                  # (T, V)
    return float((ref.exp() * (ref - other)).sum(-1).mean())


def dynamic_int8(model, keep) -> tuple[torch.nn.Module, int]:
    """A copy of `model` with the nn.Linear layers whose name `keep` accepts in dynamic int8;
    (the copy, how many layers were quantised)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and keep(n)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices, one per layer
        copy = quantize_dynamic(model, {n: per_channel_dynamic_qconfig for n in names},
                                dtype=torch.qint8, inplace=False)
    return copy, len(names)


def step_ms(engine: HFEngine, batch: int, new_tokens: int, repeats: int) -> float:
    """The decode step at `batch` rows, ms (`tools.decode_profile.decode_step`)."""
    return 1e3 * decode_step(engine, batch, new_tokens, repeats)[0]


@torch.no_grad()
def dynamic_arms(engine: HFEngine, batch: int, new_tokens: int, repeats: int,
                 arms=ARMS) -> list[dict]:
    fp32 = engine.model
    prompts, _ = prompt_ids(engine.tok, 16)
    ids = torch.tensor([prompts[0] + prompts[1]])                                    # (1, T)
    ref = fp32(ids).logits[0]                                                        # (T, V)
    rows = [{"arm": "fp32", "layers": 0, "quantise_s": 0.0, "kl": 0.0,
             "step_ms": step_ms(engine, batch, new_tokens, repeats)}]
    for name, keep in arms.items():
        t0 = time.perf_counter()
        engine.model, layers = dynamic_int8(fp32, keep)
        quantise_s = time.perf_counter() - t0
        rows.append({"arm": name, "layers": layers, "quantise_s": quantise_s,
                     "kl": token_kl(ref, engine.model(ids).logits[0]),
                     "step_ms": step_ms(engine, batch, new_tokens, repeats)})
    engine.model = fp32
    for r in rows:
        print(f"dynamic int8, {r['arm']:26s} {r['layers']:3d} layers: quantise "
              f"{r['quantise_s']:4.2f} s, decode step {r['step_ms']:6.1f} ms at {batch} rows "
              f"({rows[0]['step_ms'] / r['step_ms']:.2f}x fp32), KL {r['kl']:.3f} nats/token",
              flush=True)
    return rows


def _us(fn, *args, n: int = 50) -> float:
    """Microseconds a call of fn(*args), the mean of n after 3 warm-up calls."""
    for _ in range(3):
        fn(*args)
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return 1e6 * (time.perf_counter() - t0) / n


def weight_only(model, batch: int) -> list[dict]:
    """fp32 F.linear vs int8 weight-only matmul per distinct linear shape, at 1 and `batch` rows."""
    shapes = sorted({tuple(m.weight.shape) for m in model.modules()
                     if isinstance(m, torch.nn.Linear)})
    rows = []
    for out_f, in_f in shapes:
        w = torch.randn(out_f, in_f) * 0.02                                          # (O, I)
        scale = w.abs().amax(1) / 127                                                # (O,)
        wq = torch.round(w / scale[:, None]).to(torch.int8)                          # (O, I)
        for b in sorted({1, batch}):
            x = torch.randn(b, in_f)                                                 # (B, I)
            xb, sb = x.bfloat16(), scale.bfloat16()
            int8_mm = torch._weight_int8pack_mm
            row = {"shape": [out_f, in_f], "rows": b, "fp32_us": _us(F.linear, x, w),
                   "w8_fp32_us": _us(int8_mm, x, wq, scale, n=5),  # slow: few calls
                   "w8_bf16_us": _us(int8_mm, xb, wq, sb)}
            rows.append(row)
            print(f"weight-only int8, {out_f}x{in_f} at {b:2d} rows: fp32 "
                  f"{row['fp32_us']:7.0f} us; int8 with fp32 activations "
                  f"{row['w8_fp32_us']:8.0f} us, with bf16 "
                  f"{row['w8_bf16_us']:7.0f} us ({row['fp32_us'] / row['w8_bf16_us']:.2f}x)",
                  flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.int8_probe", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or path")
    p.add_argument("--batch", type=int, default=16, help="rows per decode step (the demo: 16)")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens every row generates")
    p.add_argument("--threads", type=int, default=1, help="torch threads (a rollout worker: 1)")
    p.add_argument("--repeats", type=int, default=2, help="calls per figure (the best is kept)")
    p.add_argument("--json", default="", help="write every figure here")
    args = p.parse_args(argv)
    if args.new_tokens < 2 or args.batch < 1:
        p.error("--new-tokens must be >= 2 and --batch >= 1")
    engine = HFEngine(resolve_model(args.model), args.threads)
    out = {"model": args.model, "threads": args.threads, "batch": args.batch,
           "dynamic": dynamic_arms(engine, args.batch, args.new_tokens, args.repeats),
           "weight_only": weight_only(engine.model, args.batch)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
