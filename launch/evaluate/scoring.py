"""Scores of held-out completions, whatever engine wrote them: greedy accuracy, strict
accuracy, format rate and pass@k (`launch.evaluate`, the demo and the experiments share them).
No torch, no model: completions in, figures out."""

from __future__ import annotations

import math
import random

from rewards.sandbox.pool import score_completions

EXAMPLES = 3
"""completions shown per set, picked at random (seeded), not the best"""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n; got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


BREAKDOWNS = ("fact", "op", "carry")
"""sample keys a score breaks down by (`by_fact`, ...), where the samples carry them: level-1
facts training asked or never did, the operation, and whether it carries or borrows"""


def breakdowns(samples: list[dict], results: list) -> dict:
    """{f"by_{key}": {value: {n, accuracy}}} for each key of BREAKDOWNS the samples carry."""
    out = {}
    for key in BREAKDOWNS:
        groups: dict[str, list[float]] = {}
        for s, r in zip(samples, results):
            if s.get(key):
                groups.setdefault(s[key], []).append(r.any_rule)
        if groups:
            out[f"by_{key}"] = {v: {"n": len(g), "accuracy": sum(g) / len(g)}
                                for v, g in sorted(groups.items())}
    return out


def score(samples: list[dict], texts: list[str], lengths: list[int], wall_s: float,
          sampled: list[list[str]] | None = None) -> dict:
    """Metrics of greedy completions `texts` (and `sampled`: K completions for each of the first
    len(sampled) samples).

    accuracy: right final number by any extraction rule (`RewardResult.any_rule`); strict: the
    asked line's answer right (as the training reward reads it) and in the asked
    `Answer: N` final-line format; format_rate: share in that format; tagged_accuracy and
    tag_rate: the same with the asked tag anywhere, not only last; pass@1, pass@K over the
    sampled questions (`pass_n` of them).
    """
    answers, styles = [s["answer"] for s in samples], [s.get("style") for s in samples]
    checks = [s.get("verifier") for s in samples]  # each sample's verifier (None: numeric)
    # this process's one verifier (rewards.sandbox.pool.shared_pool): the first evaluation starts it
    results = score_completions(texts, answers, styles=styles, verifiers=checks)
    flat = [t for group in sampled or [] for t in group]
    graded = score_completions(flat, [a for a, g in zip(answers, sampled or []) for _ in g],
                               styles=[st for st, g in zip(styles, sampled or []) for _ in g],
                               verifiers=[c for c, g in zip(checks, sampled or []) for _ in g])
    n = len(samples)
    out = {
        "accuracy": sum(r.any_rule for r in results) / n,
        "strict_accuracy": sum(r.score * (r.format_score == 1.0) for r in results) / n,
        "format_rate": sum(r.format_score == 1.0 for r in results) / n,
        # the asked style's tag anywhere (an answer line the policy has not learnt to end on)
        "tagged_accuracy": sum(r.score * (r.format_score >= 0.5) for r in results) / n,
        "tag_rate": sum(r.format_score >= 0.5 for r in results) / n,
        "n": n,
        "mean_completion_tokens": sum(lengths) / n,
        "errors": sum(r.error is not None for r in results),
        "wall_s": wall_s,
    }
    if sampled:
        k, m = len(sampled[0]), len(sampled)
        correct = [sum(r.any_rule == 1.0 for r in graded[i * k: (i + 1) * k])
                   for i in range(m)]
        out.update({"samples": k, "pass_n": m,
                    "pass@1": sum(pass_at_k(k, c, 1) for c in correct) / m,
                    f"pass@{k}": sum(pass_at_k(k, c, k) for c in correct) / m})
    out.update(breakdowns(samples, results))
    pick = sorted(random.Random(f"examples-{n}").sample(range(n), min(EXAMPLES, n)))
    out["examples"] = [{"question": samples[i]["question"], "answer": samples[i]["answer"],
                        "completion": texts[i], "correct": results[i].any_rule == 1.0}
                       for i in pick]
    return out
