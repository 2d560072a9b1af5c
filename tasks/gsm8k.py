"""GSM8K grade-school maths problems from a local JSONL file (or the HF Hub).

Each JSONL line is ``{"question": str, "answer": str}`` where the answer is the
worked solution ending in ``#### N``. Samples carry the canonical final answer
("72"), so training code never sees the solution text.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

from rewards.verifiers.reference import parse_reference
from tasks import DatasetError
from tasks.epochs import EpochOrder

# Fixed, seed-independent shuffle that decides the held-out split.
_SPLIT_SEED = "homerl-gsm8k-heldout-v1"
GSM8K_LEVEL = 0  # GSM8K is not graded by level; 0 marks "unleveled"
_MAX_LISTED_BAD_LINES = 20


def _row_to_sample(row: object, sample_id: str) -> dict | None:
    """Validate one raw row; None when it is not a usable GSM8K problem."""
    if not isinstance(row, dict):
        return None
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip() or not isinstance(solution, str):
        return None
    # The final answer must be tagged: a bare solution text is not a reference.
    if "####" not in solution:
        return None
    answer = parse_reference(solution)
    if answer is None:
        return None
    return {
        "id": sample_id,
        "question": question.strip(),
        "answer": answer,
        "task": "gsm8k",
        "level": GSM8K_LEVEL,
    }


def read_gsm8k_jsonl(path: str | Path) -> tuple[list[dict], list[int]]:
    """Read samples from a GSM8K JSONL file.

    Returns ``(samples, bad_line_numbers)``; blank lines are skipped silently.
    Raises `DatasetError` when the file cannot be read.
    """
    samples: list[dict] = []
    bad: list[int] = []
    try:
        with open(path, "rb") as handle:
            for lineno, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    row = None
                sample = _row_to_sample(row, f"gsm8k-{lineno}")
                if sample is None:
                    bad.append(lineno)
                else:
                    samples.append(sample)
    except OSError as exc:
        raise DatasetError(f"cannot read GSM8K file {path}: {exc.strerror or exc}") from exc
    return samples, bad


def _load_hub_samples() -> list[dict]:
    """Load the GSM8K train split from the Hugging Face Hub."""
    try:
        # Lazy: `datasets` is heavy and optional; local files are the normal path.
        import datasets

        rows = datasets.load_dataset("openai/gsm8k", "main", split="train")
    except (ImportError, OSError) as exc:
        raise DatasetError(
            f"cannot load openai/gsm8k from the Hub ({type(exc).__name__}); "
            "pass a local JSONL file with data_path instead"
        ) from exc
    samples = [_row_to_sample(row, f"gsm8k-hub-{i}") for i, row in enumerate(rows)]
    return [s for s in samples if s is not None]


def _report_bad_lines(path: str, bad: list[int], usable: int) -> None:
    """Raise when nothing is usable, else warn with the offending line numbers."""
    if not bad:
        return
    listed = ", ".join(map(str, bad[:_MAX_LISTED_BAD_LINES]))
    if len(bad) > _MAX_LISTED_BAD_LINES:
        listed += f" (+{len(bad) - _MAX_LISTED_BAD_LINES} more)"
    if not usable:
        raise DatasetError(f"no usable GSM8K rows in {path}; bad line(s): {listed}")
    message = f"{path}: skipped {len(bad)} bad line(s): {listed}"
    warnings.warn(message, stacklevel=3)


class GSM8KTask:
    """GSM8K with a fixed held-out split and a seeded, per-epoch training order."""

    name = "gsm8k"

    def __init__(self, path: str | None, seed: int = 0, heldout_size: int = 200):
        """Load `path` (JSONL), or the Hub copy when None; see module docstring."""
        if heldout_size < 0:
            raise ValueError(f"heldout_size must be >= 0, got {heldout_size}")
        self.seed = seed
        self.bad_lines: list[int] = []
        if path is None:
            samples = _load_hub_samples()
            source = "openai/gsm8k"
        else:
            samples, self.bad_lines = read_gsm8k_jsonl(path)
            source = str(path)
            _report_bad_lines(source, self.bad_lines, len(samples))
        if not samples:
            raise DatasetError(f"no usable GSM8K rows in {source}")
        order = list(range(len(samples)))
        random.Random(_SPLIT_SEED).shuffle(order)
        self._heldout = [samples[j] for j in order[:heldout_size]]
        # Duplicated questions exist in GSM8K: keep every copy out of training.
        reserved = {s["question"] for s in self._heldout}
        self._train = [
            samples[j] for j in order[heldout_size:] if samples[j]["question"] not in reserved
        ]
        if not self._train:
            raise DatasetError(
                f"{source}: no training rows left after a held-out split of {heldout_size}"
            )
        self._order = EpochOrder(len(self._train), f"{self.seed}-gsm8k")

    def __len__(self) -> int:
        """Number of training problems (one epoch)."""
        return len(self._train)

    def train_sample(self, i: int) -> dict:
        """Training sample number `i`: epoch ``i // len(self)``, reshuffled each epoch."""
        return dict(self._train[self._order.index(i)])

    def heldout(self, n: int) -> list[dict]:
        """The first `n` held-out samples (at most `heldout_size`), the same for every seed."""
        return [dict(s) for s in self._heldout[: max(n, 0)]]
