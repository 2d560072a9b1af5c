"""The learner's one adapter to transformers and peft: policy construction (full fine-tune,
LoRA, QLoRA on an NF4 base), the selected-position forward, the shared-prefix forward with its
replay-safe KV caches, gradient checkpointing, and the LoRA reference context.

The decoder runs on the whole sequence, but the LM head and the log-softmax run only at the
positions the entropy mask selected, which is where most of a small model's FLOPs go (vocab 49k
x hidden 576 for SmolLM2) and so where rho < 1 saves compute. Written against transformers
5.16-5.19 (cache classes and `GradientCheckpointingLayer` are internal API).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from common.models import cpu_supports_bf16, load_model, resolve_model
from common.quant import load_nf4_model

LOGITS_CHUNK_BYTES = 64 * 2**20
"""fp32 logits per chunk of the LM head's log-prob pass (learner.model.head_logprobs)"""


def pick_dtype(dtype: str) -> torch.dtype:
    """Compute dtype for autocast: bf16 where the hardware runs it fast, else fp32."""
    if dtype == "bf16":
        return torch.bfloat16
    if dtype == "fp32":
        return torch.float32
    if torch.cuda.is_available() or cpu_supports_bf16():
        return torch.bfloat16
    return torch.float32


def build_policy(model_cfg, lora_cfg, device: str = "cpu"):
    """Load the policy on `device` as the learner trains it. Returns (model, trainable_names).

    full: fp32 master weights, all trainable. lora: frozen fp32 base + fp32 adapters.
    qlora: NF4 base through bitsandbytes (runs on CPU too) + fp32 adapters.
    """
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
    workers compute theirs in fp32 too (actors/hf_worker.fp32_lm_head).
    """
    if type(head) is not torch.nn.Linear:  # an adapted or quantised head: its own forward
        return head(hidden.float()).float()
    bias = None if head.bias is None else head.bias.float()
    return F.linear(hidden.float(), head.weight.float(), bias)


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


def shared_prefix_logprobs(model, prompts: list[list[int]], completions: list[list[int]],
                           rows, cols, temperature: float = 1.0,
                           autocast_dtype=torch.float32):
    """`selected_logprobs` for prompt+completion sequences, each distinct prompt run once.

    A GRPO step holds G completions of every prompt; the prompt is usually the longer part, so
    running it once and handing its KV cache (gathered per sequence, which is differentiable:
    gradients of the G copies add up) to the completions' forward cuts the learner's FLOPs by
    about (G - 1) / G of the prompt share. Prompts are left-padded so each one's last real
    token sits in the last column, whose hidden state predicts the first completion token.
    The caches are replay-safe (learner/prefix_cache.py), so this works under gradient
    checkpointing too. Models with sliding-window layers run the plain full-sequence forward.

    prompts, completions: (m, P_i), (m, T_i) token ids, no padding.
    rows, cols: (K,) selected completion tokens (sequence, index into its completion).
    Returns logp (K,), entropy (K,) in fp32, as `selected_logprobs`.
    """
    if not supports_prefix_cache(model):
        return _full_sequence_logprobs(model, prompts, completions, rows, cols, temperature,
                                       autocast_dtype)
    decoder, head = decoder_and_head(model)
    dev, out_dev = head.weight.device, rows.device
    uniq: dict[tuple, int] = {}
    owner = [uniq.setdefault(tuple(p), len(uniq)) for p in prompts]
    distinct = list(uniq)
    P, T = max(len(p) for p in distinct), max(len(c) for c in completions)

    def t(x):
        return torch.tensor(x, device=dev)

    owner = t(owner)                                                             # (m,)
    p_ids = t([[0] * (P - len(p)) + list(p) for p in distinct])                  # (U, P)
    p_mask = t([[0] * (P - len(p)) + [1] * len(p) for p in distinct])            # (U, P)
    c_ids = t([list(c) + [0] * (T - len(c)) for c in completions])               # (m, T)
    c_mask = t([[1] * len(c) + [0] * (T - len(c)) for c in completions])         # (m, T)
    rows, cols = rows.to(dev), cols.to(dev)
    plen = p_mask.sum(1)[owner]                                                  # (m,)
    with _autocast(dev, autocast_dtype):
        recorded = record_cache()
        # use_cache=False: our explicit caches are used all the same; True would only make
        # checkpointed layers warn that they turn it off
        pre = decoder(input_ids=p_ids, attention_mask=p_mask, past_key_values=recorded,
                      use_cache=False, position_ids=(p_mask.cumsum(1) - 1).clamp(min=0))
        prefix = read_cache(*gathered(recorded, owner))                         # (m, ...)
        hidden = decoder(input_ids=c_ids, attention_mask=torch.cat([p_mask[owner], c_mask], 1),
                         past_key_values=prefix, use_cache=False,
                         position_ids=plen[:, None] + torch.arange(T, device=dev)
                         ).last_hidden_state                                     # (m, T, H)
        # column t predicts completion token t: the prompt's last state, then completion states
        h_all = torch.cat([pre.last_hidden_state[owner, -1:], hidden[:, :-1]], 1)   # (m, T, H)
    logp, entropy = head_logprobs(head, h_all[rows, cols], c_ids[rows, cols], temperature)
    return logp.to(out_dev), entropy.to(out_dev)


def _full_sequence_logprobs(model, prompts, completions, rows, cols, temperature,
                            autocast_dtype):
    """`shared_prefix_logprobs` without prefix sharing: each prompt+completion right-padded."""
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


# ---- the replay-safe KV caches of the shared-prefix forward -------------------------------------
# transformers' DynamicCache appends on every `update`, which gradient checkpointing cannot use:
# the backward pass re-runs each checkpointed layer, and a second append would change what the
# layer computes, so transformers drops the cache of checkpointed layers (GradientCheckpointing-
# Layer), which broke the prefix hand-off. These two are replay-safe, so checkpointed layers may
# keep them: the prompt pass records the keys/values it is given (a replay records the equal
# recomputed ones again); the completion pass returns prefix + new keys/values and stores
# nothing, so a replay computes exactly what the first pass did.

class _RecordLayer(DynamicLayer):
    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


class _ReadLayer(DynamicLayer):
    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values = keys, values
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        return (torch.cat([self.keys, key_states], dim=-2),
                torch.cat([self.values, value_states], dim=-2))


def record_cache() -> Cache:
    """An empty cache for the prompt pass (one `_RecordLayer` per layer, made on first use)."""
    return Cache(layer_class_to_replicate=_RecordLayer)


def gathered(cache: Cache, index: torch.Tensor) -> tuple[list, list]:
    """Per-layer (keys, values) of a recorded cache, rows picked by `index` (differentiable:
    the gradients of rows that share a prompt add up). (U, heads, P, d) -> (m, heads, P, d)."""
    return ([layer.keys[index] for layer in cache.layers],
            [layer.values[index] for layer in cache.layers])


def read_cache(keys: list[torch.Tensor], values: list[torch.Tensor]) -> Cache:
    """A fixed prefix for the completion pass; nothing is appended to it."""
    return Cache(layers=[_ReadLayer(k, v) for k, v in zip(keys, values)])


def supports_prefix_cache(model) -> bool:
    """Full-attention decoders only: sliding-window layers size their cache differently."""
    config = model.config.get_text_config(decoder=True)
    types = getattr(config, "layer_types", None) or []
    return not any(t != "full_attention" for t in types)


def enable_checkpointing(model) -> None:
    """Gradient checkpointing (non-reentrant) that keeps our replay-safe caches."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module._can_checkpoint_with_cache = True  # our caches are replay-safe (see above)


def set_threads(n: int) -> None:
    """Pin torch (and OpenMP/MKL) to n threads: each actor owns exactly its CPU share."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
