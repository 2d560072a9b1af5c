"""Adapter to transformers' KV cache for the learner's shared-prefix forward (transformers 5.x).

The learner runs each prompt once and hands its keys/values to the G completions' forward
(learner/model.shared_prefix_logprobs). transformers' own `DynamicCache` appends on every
`update`, which gradient checkpointing cannot use: the backward pass re-runs each checkpointed
layer, and a second append would change what the layer computes; so transformers drops the
cache of checkpointed layers altogether (`GradientCheckpointingLayer`), which broke the prefix
hand-off. The two caches here are replay-safe instead, so checkpointed layers may keep them:

* `record_cache()`: the prompt pass. A layer's `update` stores the keys/values it is given and
  returns them unchanged; a replay stores the recomputed (equal) tensors again.
* `read_cache(keys, values)`: the completion pass. `update` returns prefix + new keys/values
  and stores nothing, so a replay computes exactly what the first pass did.

This is the only module that touches transformers' cache classes.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer


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
