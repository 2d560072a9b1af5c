"""The web app's Evaluate and Try tabs, without Gradio: score models on held-out sets or a
user's JSONL file (the same code and table as `launch.evaluate`), and complete one prompt with
the verifier's verdict. Models load in this process (fp32) and the last two stay cached.
"""

from __future__ import annotations

import functools
import json
import os
import time

from common.models import ModelNotFoundError
from launch.app.policy import Policy, PolicyError
from launch.app.runs import FormError, checkpoints
from launch.evaluate.saved_models import evaluate_many, resolve_model_or_final, table
from launch.evaluate.sets import SET_NAMES, heldout_sets
from rewards.sandbox.pool import score_completions
from rewards.verifiers.reference import parse_reference
from tasks import DatasetError
from tasks.eval_file import read_eval_file

MAX_NEW_TOKENS = 64
"""completion length limit (launch.evaluate's default)"""

METRIC_COLUMNS = (("accuracy", "accuracy"), ("strict_accuracy", "strict"),
                  ("format_rate", "format"), ("mean_completion_tokens", "mean tokens"))


def check_models(models: list[str]) -> list[str]:
    """The picked models, each an existing checkpoint or a resolvable model. Raises FormError."""
    models = [m.strip() for m in models or [] if m and m.strip()]
    if not models:
        raise FormError("models: pick at least one model or checkpoint")
    for name in models:
        try:
            resolve_model_or_final(name)
        except ModelNotFoundError as e:
            raise FormError(str(e)) from None
    return models


def eval_sets(builtin: list[str], n: int, upload: str | None) -> dict[str, list[dict]]:
    """Built-in held-out sets (n problems each) and a user's uploaded JSONL file (every line)."""
    if not isinstance(n, (int, float)) or n < 1:
        raise FormError(f"problems per set: must be >= 1; got {n}")
    bad = [s for s in builtin or [] if s not in SET_NAMES]
    if bad:
        raise FormError(f"sets: {bad[0]!r} must be one of {', '.join(SET_NAMES)}")
    try:
        sets = heldout_sets(",".join(builtin or []), int(n), None) if builtin else {}
        if upload:
            sets[os.path.splitext(os.path.basename(upload))[0]] = read_eval_file(upload)
    except (DatasetError, ValueError) as e:
        raise FormError(str(e)) from None
    if not sets:
        raise FormError("sets: pick a held-out set or upload a JSONL file")
    return sets


def markdown_table(results: list[dict]) -> str:
    """One row per (model, set): size, accuracy, strict, format, mean tokens, pass@k."""
    extra = sorted({k for r in results for res in r["sets"].values() for k in res
                    if k.startswith("pass@")}, key=lambda k: int(k[5:]))
    head = ["model", "set", "n", *(t for _, t in METRIC_COLUMNS), *extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        for name, res in r["sets"].items():
            cells = [r["model"], name, str(res["n"])]
            cells += [f"{res[k]:.1f}" if k == "mean_completion_tokens" else f"{res[k]:.1%}"
                      for k, _ in METRIC_COLUMNS]
            cells += [f"{res[k]:.1%}" if k in res else "" for k in extra]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def permitted(policy: Policy | None, models: list[str] = (), prompt: str = "", n: int = 0,
              samples: int = 0, upload: str | None = None) -> None:
    """FormError unless the server's policy allows these models and inputs (no policy: the
    functions called directly, not from the page)."""
    if policy is None:
        return
    try:
        listed = checkpoints(policy.runs_root)
        for m in models or []:
            policy.check_model(m.strip(), listed)
        policy.check_prompt(prompt or "")
        policy.check_eval(int(n or 0), int(samples or 0))
        if upload:
            policy.check_upload(upload)
    except PolicyError as e:
        raise FormError(str(e)) from None


def run_eval(models: list[str], builtin: list[str], n: int, upload: str | None = None,
             samples: int = 0, out_dir: str = "runs/evals", policy: Policy | None = None
             ) -> tuple[str, str, list[dict]]:
    """Evaluate every model on every set, as `launch.evaluate` does: returns (markdown table,
    launch.evaluate's accuracy table as text, path of the JSON written). Raises FormError."""
    samples = int(samples or 0)
    if samples < 0 or samples == 1:
        raise FormError(f"samples: must be 0 (greedy only) or >= 2; got {samples}")
    permitted(policy, models, n=n, samples=samples, upload=upload)
    models, sets = check_models(models), eval_sets(builtin, n, upload)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    results = evaluate_many(models, sets, torch.float32, MAX_NEW_TOKENS, batch_size=32,
                            k=samples)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"eval-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    return markdown_table(results), table(results, list(sets)), path


@functools.lru_cache(maxsize=2)
def _loaded(model: str):
    import torch

    from actors.eval_worker import load_for_eval  # torch: loaded when a page first evaluates

    return load_for_eval(model, torch.float32)


def verdict(completion: str, expected: str) -> str:
    """The verifier's word on `completion` against `expected`, in one line."""
    (r,) = score_completions([completion], [expected])  # the app's one verifier process
    right = "correct" if r.score == 1.0 else "wrong"
    fmt = "in the asked 'Answer: N' format" if r.format_score == 1.0 else "not in the asked format"
    parsed = f"parsed answer {r.parsed}" if r.parsed is not None else "no answer parsed"
    code = f", error code {r.error}" if r.error else ""
    return f"{right}: {parsed}, {fmt}{code}"


def try_model(model: str, prompt: str, greedy: bool = True, expected: str = "",
              max_new_tokens: int = MAX_NEW_TOKENS, seed: int | None = None,
              policy: Policy | None = None) -> tuple[str, str]:
    """Complete one question (chat-formatted with the task's answer instruction, as in
    training) from `model`: (completion, verdict or '' without an expected answer)."""
    from actors.eval_worker import greedy_complete, sample_complete  # torch, as in _loaded

    if not prompt or not prompt.strip():
        raise FormError("prompt: write a question")
    permitted(policy, [model], prompt=prompt)
    expected = (expected or "").strip()
    if expected and parse_reference(expected) is None:
        raise FormError(f"expected answer: must be a number or GSM8K's '#### N'; got {expected!r}")
    (name,) = check_models([model])
    net, tok = _loaded(name)
    if greedy:
        text = greedy_complete(net, tok, [prompt], max_new_tokens, 1, progress=False)[0]
    else:
        seed = int(time.time()) if seed is None else seed
        text = sample_complete(net, tok, [prompt], max_new_tokens, 1, seed=seed,
                               progress=False)[0][0]
    return text, verdict(text, expected) if expected else ""
