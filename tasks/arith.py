"""Synthetic arithmetic tasks in three difficulty levels, in many phrasings.

Level 1: single-digit ``a + b`` / ``a - b``; level 2: two/three-digit ``+``, ``-``, ``*`` (small
multiplier); level 3: two-step word problems. All answers are non-negative integers. Every
problem is rendered by one of the level's question templates (tasks/phrasings.py): 12 or 11
`seen` ones that training uses and 4 `unseen` ones that appear only in the held-out split
`unseen`, which therefore measures transfer to new phrasings.

Two held-out splits per level, each of `HELDOUT_SIZE` distinct questions, the same for every
seed: `seen` (seen templates, questions whose stable hash falls in bucket 0 of
`HELDOUT_BUCKETS`; the training stream rejects and resamples those) and `unseen` (the unseen
templates, which the training stream never uses). The hash is sha256 of the question text,
not Python's per-process salted ``hash()``.

Level 1 has only 155 facts (a, op, b), so a question held out by its text still asks a fact
training asks in other words. A fixed fifth of the facts (`is_heldout_fact`, 34 of them) never
appears in training under any phrasing; each level-1 held-out sample says which kind it asks
(`"fact": "seen" | "unseen"`), so a split's score breaks down into facts x templates. Held-out
samples of levels 1-2 also say what they exercise (`kind`: `"op"` add / subtract / multiply and
`"carry"`: whether the written method carries or borrows), for per-operation scores.
"""

from __future__ import annotations

import hashlib
import random

from tasks.phrasings import BINARY_SEEN, BINARY_UNSEEN, WORD_SEEN, WORD_UNSEEN, binary_text

HELDOUT_BUCKETS = 5
HELDOUT_SIZE = 200
"""questions per held-out split and level"""
LEVELS = (1, 2, 3)
SPLITS = ("seen", "unseen")
_HELDOUT_SEED = "homerl-arith-heldout-v2"  # fixed: independent of any training seed
_MAX_HELDOUT_ATTEMPTS_PER_ITEM = 50

Problem = tuple[str, int]


def stable_bucket(text: str, buckets: int = HELDOUT_BUCKETS) -> int:
    """Deterministic bucket of `text`, identical in every process and Python run."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def is_heldout_question(question: str) -> bool:
    """True when `question` is reserved for the held-out split."""
    return stable_bucket(question) == 0


def is_heldout_fact(a: int, op: str, b: int) -> bool:
    """True for the level-1 facts training never asks (bucket 0 of their own stable hash)."""
    return stable_bucket(f"fact {a} {op} {b}") == 0


def level1_facts() -> list[tuple[int, str, int]]:
    """Every distinct level-1 problem (155 of them) as (a, op, b), in a fixed order."""
    return ([(a, "+", b) for a in range(10) for b in range(10)]
            + [(a, "-", b) for a in range(10) for b in range(a + 1)])


def _binary_numbers(level: int, rng: random.Random) -> tuple[int, str, int]:
    if level == 1:
        op, a, b = rng.choice("+-"), rng.randint(0, 9), rng.randint(0, 9)
    else:
        op, a = rng.choice("+-*"), rng.randint(10, 999)
        # Multiplier stays small so level 2 is a step up from level 1, not a cliff.
        b = rng.randint(2, 12) if op == "*" else rng.randint(10, 999)
    if op == "-" and a < b:
        a, b = b, a  # keep answers non-negative
    return a, op, b


def _answer(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


OP_NAMES = {"+": "add", "-": "subtract", "*": "multiply"}


def needs_carry(a: int, op: str, b: int) -> bool:
    """True when the written method carries (or borrows) in some column: a column's digits
    sum to 10 or more (+), a column's digit is too small after the borrow (-), or a digit of
    `a` times the whole multiplier (at most 12, taken as one digit) reaches 10 (*)."""
    if op == "*":
        return any(int(d) * b >= 10 for d in str(a))  # the first carry needs a digit x b >= 10
    while a or b:
        da, db = a % 10, b % 10
        if da + db >= 10 if op == "+" else da < db:
            return True  # the first carry (or borrow): columns to its right carried nothing
        a, b = a // 10, b // 10
    return False


def kind(a: int, op: str, b: int) -> dict:
    """What a held-out binary problem exercises, for the per-operation breakdown of scores."""
    return {"op": OP_NAMES[op], "carry": "carry" if needs_carry(a, op, b) else "no carry"}


def templates(level: int, split: str) -> tuple:
    """The question templates of `level` for `split` ('seen' trains, 'unseen' never does)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if level == 3:
        return WORD_SEEN if split == "seen" else WORD_UNSEEN
    return BINARY_SEEN if split == "seen" else BINARY_UNSEEN


def sample_problem(level: int, split: str, rng: random.Random,
                   train: bool = False) -> tuple[Problem, str, dict]:
    """((question, answer), template name, `kind` of a binary problem or {}) drawn with `rng`
    from the split's templates; `train`: never a held-out level-1 fact (`is_heldout_fact`)."""
    template = rng.choice(templates(level, split))
    if level == 3:
        return template(rng), template.__name__, {}
    a, op, b = _binary_numbers(level, rng)
    while train and level == 1 and is_heldout_fact(a, op, b):
        a, op, b = _binary_numbers(level, rng)
    return (binary_text(template, a, op, b), _answer(a, op, b)), template.__name__, kind(a, op, b)


class ArithmeticTask:
    """Arithmetic problems of one level; samples are pure functions of (seed, level, i)."""

    name = "arith"

    def __init__(self, level: int = 1, seed: int = 0):
        """`level` in `LEVELS`; `seed` only affects the training stream."""
        if level not in LEVELS:
            raise ValueError(f"arith level must be one of {LEVELS}, got {level!r}")
        self.level = level
        self.seed = seed

    def _sample(self, sample_id: str, problem: Problem, template: str, split: str,
                info: dict | None = None) -> dict:
        """`info`: what a held-out problem exercises (op, carry; level 1 also its fact)."""
        question, answer = problem
        out = {"id": sample_id, "question": question, "answer": str(answer),
               "task": self.name, "level": self.level, "template": template, "split": split}
        return out | (info or {})

    def train_sample(self, i: int) -> dict:
        """Training sample number `i` (i >= 0): a seen template, never a held-out question."""
        if i < 0:
            raise ValueError(f"sample index must be >= 0, got {i}")
        # A str seed is hashed with sha512 by `random`, so this is stable across runs.
        rng = random.Random(f"{self.seed}-{self.level}-{i}")
        while True:
            problem, template, _ = sample_problem(self.level, "seen", rng, train=True)
            if not is_heldout_question(problem[0]):
                return self._sample(f"arith-l{self.level}-s{self.seed}-{i}", problem, template,
                                    "train")

    def heldout(self, n: int, split: str = "seen") -> list[dict]:
        """The first `n` (at most HELDOUT_SIZE) questions of a held-out split, the same for
        every seed; distinct questions only."""
        n = min(max(n, 0), HELDOUT_SIZE)
        return [self._sample(f"arith-l{self.level}-{split}-{j}", problem, template, split, info)
                for j, (problem, template, info) in enumerate(self._heldout(split)[:n])]

    def _heldout(self, split: str) -> list[tuple[Problem, str, dict]]:
        rng = random.Random(f"{_HELDOUT_SEED}-{self.level}-{split}")
        keep = is_heldout_question if split == "seen" else (lambda q: True)
        if self.level == 1:  # small: enumerate every question, shuffle once
            every = [((binary_text(t, a, op, b), _answer(a, op, b)), t.__name__,
                      kind(a, op, b) | {"fact": "unseen" if is_heldout_fact(a, op, b) else "seen"})
                     for t in templates(1, split) for a, op, b in level1_facts()]
            chosen = [p for p in every if keep(p[0][0])]
            rng.shuffle(chosen)
            return chosen[:HELDOUT_SIZE]
        out, seen = [], set()
        for _ in range(_MAX_HELDOUT_ATTEMPTS_PER_ITEM * HELDOUT_SIZE):
            if len(out) >= HELDOUT_SIZE:
                break
            problem, template, info = sample_problem(self.level, split, rng)
            if keep(problem[0]) and problem[0] not in seen:
                seen.add(problem[0])
                out.append((problem, template, info))
        return out
