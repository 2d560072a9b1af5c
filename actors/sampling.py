"""What a rollout worker samples from: `rollout.*` alone decides it, on both engines.

A hub model's `generation_config.json` may carry sampling settings (Qwen2.5-Instruct ships
`repetition_penalty`, `top_k`, `top_p`, `temperature`). Left in force, they would change what
is sampled while the learner scores the plain distribution softmax(logits / T): the samples
would be off-policy without a sign. So:

* HF `generate` gets a complete `GenerationConfig` (`hf_generation_config`) in which every
  setting that changes the distribution is explicitly neutral, and the model's own
  `generation_config` is replaced by it too (transformers fills any field left `None` from the
  model's config). The temperature is applied by `BehaviourRecorder`, the last logits processor,
  which also records the behaviour log-probs from the very scores that are sampled from, so a
  processor that slipped in anyway shows up as `policy/logp_diff` in the learner.
* vLLM gets every `SamplingParams` field that changes the distribution
  (`actors.vllm_engine.sampling_kwargs`) and the engine is started with
  `generation_config="vllm"` (vLLM's neutral defaults).
* `model_overrides` names the model's own settings that were overridden; workers log it once.

Truncated distributions (top_p < 1, top_k > 0) are refused by the config (`rollout.top_p`,
`rollout.top_k`): the learner scores the full distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NEUTRAL = {
    "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": None, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None,
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None, "sequence_bias": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "min_length": 0, "min_new_tokens": None, "exponential_decay_length_penalty": None,
    "renormalize_logits": False, "remove_invalid_values": False, "guidance_scale": None,
    "watermarking_config": None, "num_beams": 1, "num_beam_groups": 1,
    "presence_penalty": 0.0, "frequency_penalty": 0.0,
}
"""every generation setting that can change the sampled distribution, at its neutral value
(HF names; vLLM's presence/frequency penalties included)"""
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff",
                 "eta_cutoff", "top_h")
"""settings that only truncate or reshape a sampled distribution (no effect on greedy search)"""


def hf_generation_config(max_new_tokens: int, eos_ids: list[int], pad_id: int,
                         greedy: bool = False):
    """A complete GenerationConfig: sampling at temperature 1 with no logits processor of its
    own (the temperature comes from `BehaviourRecorder`), or greedy."""
    from transformers import GenerationConfig

    known = GenerationConfig().to_dict()
    neutral = {k: v for k, v in NEUTRAL.items() if k in known}
    if greedy:  # sampling-only settings unused by greedy search: left out, so none is flagged
        neutral = {k: v for k, v in neutral.items() if k not in SAMPLING_ONLY}
    return GenerationConfig(**neutral, do_sample=not greedy, max_new_tokens=max_new_tokens,
                            eos_token_id=list(eos_ids), pad_token_id=pad_id, use_cache=True)


def stop_ids(model, tokenizer) -> list[int]:
    """EOS ids to stop on: the model's generation config's and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(ids | ({tokenizer.eos_token_id} - {None}))


def own_generation(model, tokenizer, max_new_tokens: int, greedy: bool = False):
    """Replace the model's generation config by ours (neutral, see the module docstring) and
    return it: transformers fills any unset field of a call's config from the model's own."""
    config = hf_generation_config(max_new_tokens, stop_ids(model, tokenizer),
                                  tokenizer.pad_token_id, greedy=greedy)
    model.generation_config = config
    return config


def model_overrides(model_config: dict, temperature: float) -> list[str]:
    """The model's own sampling settings that `rollout.*` overrides, as 'name=theirs (ours)'.

    model_config: the model's generation config as a dict (`GenerationConfig.to_dict()`).
    """
    ours = {**NEUTRAL, "temperature": temperature}
    out = []
    for name in sorted(ours):
        theirs = model_config.get(name)
        if theirs is None or theirs == ours[name] or (name == "min_p" and theirs == 0):
            continue
        out.append(f"{name}={theirs!r} ({ours[name]!r})")
    if model_config.get("do_sample") is False:
        out.append("do_sample=False (True)")
    return out


def read_generation_config(path: str) -> dict:
    """The checkpoint's generation_config.json as a dict ({} when it has none)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path).to_dict()
    except OSError:
        return {}


class BehaviourRecorder:
    """The last logits processor of a sampled `generate`: divides the scores by the
    temperature and records, at every generated position, the entropy of the distribution
    that is sampled from and (one call later, once the token is known) the log-prob of the
    sampled token. Both in fp32; only one (N, V) row of log-probs is kept at a time.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature > 0 else 1.0  # greedy: record T = 1
        self.logp: list[torch.Tensor] = []
        self.entropy: list[torch.Tensor] = []
        self.prev: torch.Tensor | None = None  # (N, V) log-probs of the last position

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:  # the token sampled from `prev` is now input_ids[:, -1]
            self.logp.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))     # (N,)
        scores = scores.float() / self.temperature                                   # (N, V)
        logp_all = F.log_softmax(scores, dim=-1)                                     # (N, V)
        self.entropy.append(-(logp_all.exp() * logp_all).sum(-1))                    # (N,)
        self.prev = logp_all
        return scores

    def finish(self, generated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy), both (N, T), for the generated tokens (N, T)."""
        T = generated.shape[1]
        if len(self.logp) < T and self.prev is not None:
            self.logp.append(self.prev.gather(-1, generated[:, -1:]).squeeze(-1))
        self.prev = None
        if T == 0:
            empty = torch.zeros(generated.shape[0], 0)
            return empty, empty
        return torch.stack(self.logp[:T], 1), torch.stack(self.entropy[:T], 1)
