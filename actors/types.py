"""What a rollout worker returns: one RolloutBatch per `generate` call.

Shared by the HF and vLLM workers; plain lists and numpy arrays so Ray moves it cheaply.
N = prompts x group_size completions, ordered prompt-major (prompt 0's G completions first).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RolloutBatch:
    prompt_ids: list[list[int]]
    """(N, P_i) prompt token ids of each completion's prompt"""
    completion_ids: list[list[int]]
    """(N, T_i) sampled token ids, ending with EOS when finish_reason is 'stop'"""
    logprobs: list[np.ndarray]
    """(N, T_i) behaviour log-probs of the sampled tokens (at the sampling temperature)"""
    entropy: list[np.ndarray]
    """(N, T_i) entropy of the sampling distribution at each generated position"""
    finish_reasons: list[str]
    """(N,) 'stop' (EOS) or 'length' (hit max_new_tokens)"""
    texts: list[str]
    """(N,) decoded completions"""
    prompt_index: list[int]
    """(N,) index of the prompt (in the call's prompt list) each completion answers"""
    correct: np.ndarray
    """(N,) verified correctness score in [0, 1]"""
    format_score: np.ndarray
    """(N,) format score in [0, 1]"""
    rewards: np.ndarray
    """(N,) correct + format_weight * format_score"""
    reward_errors: list[str | None]
    """(N,) verifier error code, None when the completion parsed"""
    version: int
    """policy version that generated every completion here"""
    num_prompts: int
    """prompts this call was given (skipped ones included)"""
    gen_time_s: float = 0.0
    """wall time of generation + verification on the worker"""
    worker: str = ""
    """name of the worker that produced it"""
    answers: list[str | None] = field(default_factory=list)
    """(N,) the verifier's normalised final answer of each completion (None: none found)"""
    rss_gb: float = 0.0
    """resident memory of the worker(s) that produced it, GB (summed by concat)"""
    skipped: list[dict] = field(default_factory=list)
    """prompts refused before generation (e.g. longer than max_prompt_tokens), with reason"""

    @property
    def num_tokens(self) -> int:
        return int(sum(len(c) for c in self.completion_ids))

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Join worker batches in order; prompt indices are offset to stay unique."""
        out = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "entropy",
                               "finish_reasons", "texts", "prompt_index", "reward_errors",
                               "answers", "skipped")}
        arrays = {"correct": [], "format_score": [], "rewards": []}
        offset = 0
        for b in batches:
            for k in out:
                if k == "prompt_index":
                    out[k].extend(i + offset for i in b.prompt_index)
                else:
                    out[k].extend(getattr(b, k))
            for k in arrays:
                arrays[k].append(getattr(b, k))
            offset += b.num_prompts
        versions = {b.version for b in batches}
        return RolloutBatch(**out, **{k: np.concatenate(v) if v else np.zeros(0)
                                      for k, v in arrays.items()},
                            version=min(versions), num_prompts=offset,
                            gen_time_s=max(b.gen_time_s for b in batches),
                            rss_gb=sum(b.rss_gb for b in batches),
                            worker=",".join(b.worker for b in batches))
