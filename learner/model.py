"""The learner's one adapter to transformers and peft: policy construction (full fine-tune,
LoRA, QLoRA on an NF4 base), the selected-position forward, the shared-prefix forward (a prompt
and its completions packed in one row), gradient checkpointing, and the LoRA reference context.

The decoder runs on the whole sequence, but the LM head and the log-softmax run only at the
positions the entropy mask selected, which is where most of a small model's FLOPs go (vocab 49k
x hidden 576 for SmolLM2) and so where rho < 1 saves compute. Written against transformers
5.16-5.19 (a custom 4D attention mask is passed through as is: `masking_utils`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common.device import torch_dtype
from common.lm_head import fp32_logits
from common.models import load_model, resolve_model
from common.quant import load_nf4_model

LOGITS_CHUNK_BYTES = 64 * 2**20
"""fp32 logits per chunk of the LM head's log-prob pass (learner.model.head_logprobs)"""


def pick_dtype(dtype: str) -> torch.dtype:
    """Compute dtype of the base (common.device.compute_dtype): on a GPU bf16 from compute
    capability 8.0, fp16 below; on a CPU fp32 (common.device.CPU_AUTO_DTYPE). Trainable tensors
    stay fp32 whatever it is (`build_policy`)."""
    return torch_dtype(dtype, "cuda" if torch.cuda.is_available() else "cpu")


def hide_bitsandbytes_in_this_actor(mode: str) -> bool:
    """Make bitsandbytes absent for peft and transformers in a Ray actor that never quantises.

    peft imports bitsandbytes whenever it is installed, and bitsandbytes' CPU backend imports
    torch's inductor: ~1.4 s of CPU at every LoRA or full learner start, for nothing. Only in
    a Ray actor's own process, which holds one learner (one mode) for its whole life; a driver,
    a test or a notebook may build a QLoRA model later and keeps it. A `None` in `sys.modules`
    is Python's own "not importable" mark. Returns whether it hid it.
    """
    ray = sys.modules.get("ray")
    if mode == "qlora" or ray is None or not ray.is_initialized():
        return False
    if "bitsandbytes" in sys.modules or "peft" in sys.modules:
        return False  # too late (or already hidden): peft decided when it was imported
    if ray.get_runtime_context().get_actor_id() is None:
        return False  # a driver, not an actor
    sys.modules["bitsandbytes"] = None
    return True


def build_policy(model_cfg, lora_cfg, device: str = "cpu"):
    """Load the policy on `device` as the learner trains it. Returns (model, trainable_names).

    full: fp32 master weights, all trainable. lora: frozen fp32 base + fp32 adapters.
    qlora: NF4 base through bitsandbytes (runs on CPU too) + fp32 adapters.
    """
    hide_bitsandbytes_in_this_actor(lora_cfg.mode)
    path = resolve_model(model_cfg.name)
    if lora_cfg.mode == "qlora":
        model = load_nf4_model(path, pick_dtype(model_cfg.dtype), device)
    else:
        # A frozen LoRA base needs no fp32 master copy: holding it in the compute dtype skips
        # autocast's per-forward weight casts (1.7x faster on one AMX core) and matches the
        # rollout workers' bf16 weights. Full fine-tuning keeps fp32 masters under autocast.
        base_dtype = pick_dtype(model_cfg.dtype) if lora_cfg.mode == "lora" else torch.float32
        model = load_model(path, dtype=base_dtype).to(device)
    if model_cfg.gradient_checkpointing:
        enable_checkpointing(model)
    if lora_cfg.mode in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        peft_cfg = LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha,
                              lora_dropout=lora_cfg.dropout,
                              target_modules=lora_cfg.modules(), task_type="CAUSAL_LM")
        model = get_peft_model(model, peft_cfg)
        if model_cfg.gradient_checkpointing:
            model.enable_input_require_grads()
    model.train()
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()  # trainable tensors (adapters) always fp32
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return model, names


def reference_logprobs_context(model):
    """A context in which a LoRA policy computes its base's (the KL reference's) log-probs."""
    return model.disable_adapter()


def decoder_and_head(model):
    """(decoder, lm_head) of a causal LM, unwrapping a peft model (adapters stay active)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def selected_logprobs(model, input_ids, attention_mask, pos_rows, pos_cols, targets,
                      temperature: float = 1.0, autocast_dtype=torch.float32):
    """Log-probs (and entropies) of `targets` at selected positions only.

    input_ids, attention_mask: (M, L) right-padded prompt+completion.
    pos_rows, pos_cols: (K,) positions whose hidden state predicts `targets` (K,).
    Returns logp (K,), entropy (K,) in fp32; the LM head runs on K rows instead of M*L.
    """
    decoder, head = decoder_and_head(model)
    with _autocast(input_ids.device, autocast_dtype):
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return head_logprobs(head, hidden[pos_rows, pos_cols], targets, temperature)


def head_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                  chunk_bytes: int = LOGITS_CHUNK_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(head(hidden) / temperature) at `targets`, and the entropy, row by row.

    hidden: (K, H); targets: (K,). Returns logp (K,) with grad, entropy (K,) without.
    A (K, V) fp32 logits tensor and its log-softmax are ~8 K V bytes held for the backward
    (0.5 GB for 400 rows of Qwen2's 152k vocabulary): rows go through in chunks of
    `chunk_bytes` of logits, each chunk recomputed in the backward instead of kept.
    """
    rows = max(1, chunk_bytes // (4 * head.weight.shape[0]))
    if hidden.shape[0] <= rows:
        return _target_logprobs(head_fp32(head, hidden) / temperature, targets)

    def chunk(h, t):
        return _target_logprobs(head_fp32(head, h) / temperature, t)

    parts = [checkpoint(chunk, h, t, use_reentrant=False)
             for h, t in zip(hidden.split(rows), targets.split(rows))]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def head_fp32(head, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head in fp32 whatever the body's dtype (outside autocast): (K, H) -> (K, V).

    bf16 logits carry ~3 significant digits, enough to move a log-prob by 1e-2; the rollout
    engines compute theirs the same way (common/lm_head.py), and a frozen 16-bit head is
    widened a slice at a time, so no fp32 copy of its weight is made.
    """
    if type(head) is not torch.nn.Linear:  # an adapted or quantised head: its own forward
        return head(hidden.float()).float()
    return fp32_logits(hidden, head.weight, head.bias)


def _autocast(device: torch.device, dtype: torch.dtype):
    """Autocast to `dtype` on `device`, or nothing for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _target_logprobs(logits, targets):
    """log softmax(logits) at `targets`, and (no grad) the entropy of each row.

    logits: (K, V) fp32, already divided by the temperature; targets: (K,).
    """
    logp_all = F.log_softmax(logits, dim=-1)                    # (K, V)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)    # (K,)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)          # (K,)
    return logp, entropy


class Packed(NamedTuple):
    """Each distinct prompt and all of its completions in one row: [prompt][c_1][c_2]...

    U packed rows of width L (right-padded); m sequences (prompt i + completion i).
    """

    ids: torch.Tensor
    """(U, L) token ids, 0 in the padding"""
    positions: torch.Tensor
    """(U, L) position ids: the prompt 0..P-1, every completion P.. again"""
    segment: torch.Tensor
    """(U, L) 0 the prompt, j >= 1 the row's j-th completion, -1 padding"""
    row: torch.Tensor
    """(m,) the packed row holding sequence i"""
    start: torch.Tensor
    """(m,) column of completion i's first token"""
    prompt_end: torch.Tensor
    """(m,) column of sequence i's last prompt token (its state predicts completion token 0)"""


def pack_by_prompt(prompts: list[list[int]], completions: list[list[int]]) -> Packed:
    """Pack sequences sharing a prompt into one row (pure: lists in, CPU tensors out)."""
    rows: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompts):
        rows.setdefault(tuple(p), []).append(i)
    m = len(prompts)
    row, start, prompt_end = [0] * m, [0] * m, [0] * m
    ids, pos, seg = [], [], []
    for u, (prompt, members) in enumerate(rows.items()):
        r_ids, r_pos, r_seg = list(prompt), list(range(len(prompt))), [0] * len(prompt)
        for j, i in enumerate(members, 1):
            row[i], start[i], prompt_end[i] = u, len(r_ids), len(prompt) - 1
            n = len(completions[i])
            r_ids += list(completions[i])
            r_pos += range(len(prompt), len(prompt) + n)
            r_seg += [j] * n
        ids.append(r_ids)
        pos.append(r_pos)
        seg.append(r_seg)
    L = max(len(r) for r in ids)

    def padded(rs, fill):
        return torch.tensor([list(r) + [fill] * (L - len(r)) for r in rs])

    return Packed(padded(ids, 0), padded(pos, 0), padded(seg, -1), torch.tensor(row),
                  torch.tensor(start), torch.tensor(prompt_end))


def packed_mask(segment: torch.Tensor) -> torch.Tensor:
    """(U, L) segments -> (U, 1, L, L) bool, True where query q may attend key k: causal, and
    k is in the prompt or in q's own completion (a completion never sees its siblings).
    Padding sees the prompt and earlier padding only, so no row of the softmax is empty."""
    L = segment.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=segment.device).tril()   # (L, L)
    q, k = segment[:, :, None], segment[:, None, :]                      # (U, L, 1), (U, 1, L)
    return (causal & ((k == 0) | (k == q)))[:, None]                             # (U, 1, L, L)


def shared_prefix_logprobs(model, prompts: list[list[int]], completions: list[list[int]],
                           rows, cols, temperature: float = 1.0,
                           autocast_dtype=torch.float32):
    """`selected_logprobs` for prompt+completion sequences, each distinct prompt run once.

    A GRPO step holds G completions of every prompt, and the prompt is usually the longer
    part. Each prompt and all of its completions go into one packed row (`pack_by_prompt`)
    with a block attention mask (`packed_mask`): a completion attends to its prompt and to
    itself, and its positions restart after the prompt, so every log-prob and gradient equals
    the plain forward's, while the prompt runs once and no completion is padded to the longest
    one. Other models (`supports_packing`) run the plain full-sequence forward.

    prompts, completions: (m, P_i), (m, T_i) token ids, no padding.
    rows, cols: (K,) selected completion tokens (sequence, index into its completion).
    Returns logp (K,), entropy (K,) in fp32, as `selected_logprobs`.
    """
    if not supports_packing(model):
        return _full_sequence_logprobs(model, prompts, completions, rows, cols, temperature,
                                       autocast_dtype)
    decoder, head = decoder_and_head(model)
    dev, out_dev = head.weight.device, rows.device
    pk = Packed(*(t.to(dev) for t in pack_by_prompt(prompts, completions)))
    rows, cols = rows.to(dev), cols.to(dev)
    mask = packed_mask(pk.segment)                                               # (U, 1, L, L)
    if model.config._attn_implementation == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(mask.shape, device=dev).masked_fill(~mask, torch.finfo().min)
    with _autocast(dev, autocast_dtype):
        hidden = decoder(input_ids=pk.ids, attention_mask=mask, position_ids=pk.positions,
                         use_cache=False).last_hidden_state                      # (U, L, H)
    # completion token c is predicted by the state before it: the prompt's last for c = 0
    r, first = pk.row[rows], pk.start[rows]                                      # (K,), (K,)
    at = torch.where(cols > 0, first + cols - 1, pk.prompt_end[rows])            # (K,)
    logp, entropy = head_logprobs(head, hidden[r, at], pk.ids[r, first + cols], temperature)
    return logp.to(out_dev), entropy.to(out_dev)


def _full_sequence_logprobs(model, prompts, completions, rows, cols, temperature,
                            autocast_dtype):
    """`shared_prefix_logprobs` without packing: each prompt+completion right-padded."""
    dev, out_dev = decoder_and_head(model)[1].weight.device, rows.device
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    L = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs], device=dev)      # (m, L)
    attn = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs], device=dev)
    plen = torch.tensor([len(p) for p in prompts], device=dev)
    rows, cols = rows.to(dev), cols.to(dev)
    pos = plen[rows] + cols                                                      # (K,)
    logp, entropy = selected_logprobs(model, ids, attn, rows, pos - 1, ids[rows, pos],
                                      temperature, autocast_dtype)
    return logp.to(out_dev), entropy.to(out_dev)


def supports_packing(model) -> bool:
    """Full-attention decoders under sdpa or eager attention only: a sliding-window layer would
    need its own packed mask, and flash-attention kernels take no 4D mask."""
    config = model.config.get_text_config(decoder=True)
    types = getattr(config, "layer_types", None) or []
    return (model.config._attn_implementation in ("sdpa", "eager")
            and not any(t != "full_attention" for t in types))


def enable_checkpointing(model) -> None:
    """Gradient checkpointing (non-reentrant)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def set_threads(n: int) -> None:
    """Pin torch (and OpenMP/MKL) to n threads: each actor owns exactly its CPU share."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
