"""Synthetic arithmetic tasks in three difficulty levels.

Level 1: single-digit ``a + b`` / ``a - b``; level 2: two/three-digit ``+``, ``-``, ``*``;
level 3: templated two-step word problems. All answers are non-negative integers.

Held-out/train separation is by construction: a question belongs to the held-out
split iff a stable hash of its text (sha256, not Python's per-process salted
``hash()``) falls in bucket 0 of `HELDOUT_BUCKETS`. The training stream rejects
and resamples such questions, and the held-out set only contains them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

HELDOUT_BUCKETS = 5
LEVELS = (1, 2, 3)
_HELDOUT_SEED = "homerl-arith-heldout-v1"  # fixed: independent of any training seed
# Level 2/3 spaces are huge; this only bounds the loop should a generator degenerate.
_MAX_HELDOUT_ATTEMPTS_PER_ITEM = 50

Problem = tuple[str, int]
_NAMES = ("Tom", "Mia", "Sam", "Ava", "Leo", "Zoe", "Ben", "Ivy")
_ITEMS = ("apples", "marbles", "stickers", "cards", "shells")


def stable_bucket(text: str, buckets: int = HELDOUT_BUCKETS) -> int:
    """Deterministic bucket of `text`, identical in every process and Python run."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def is_heldout_question(question: str) -> bool:
    """True when `question` is reserved for the held-out split."""
    return stable_bucket(question) == 0


def _binary(a: int, op: str, b: int) -> Problem:
    """Question text and answer for ``a op b``."""
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", value


def _level1(rng: random.Random) -> Problem:
    op = rng.choice("+-")
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if op == "-" and a < b:
        a, b = b, a  # keep answers non-negative
    return _binary(a, op, b)


def _level2(rng: random.Random) -> Problem:
    op = rng.choice("+-*")
    a = rng.randint(10, 999)
    # Multiplier stays small so level 2 is a step up from level 1, not a cliff.
    b = rng.randint(2, 12) if op == "*" else rng.randint(10, 999)
    if op == "-" and a < b:
        a, b = b, a
    return _binary(a, op, b)


def _buy_and_give(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    start, bags, per_bag = rng.randint(2, 30), rng.randint(2, 6), rng.randint(2, 12)
    give = rng.randint(1, start + bags * per_bag)
    question = (
        f"{name} has {start} {item}, buys {bags} bags of {per_bag} {item} each, "
        f"then gives away {give}. How many {item} does {name} have?"
    )
    return question, start + bags * per_bag - give


def _reading(rng: random.Random) -> Problem:
    name = rng.choice(_NAMES)
    pages, days, extra = rng.randint(5, 40), rng.randint(2, 9), rng.randint(1, 50)
    question = (
        f"{name} reads {pages} pages a day for {days} days, then reads {extra} more pages. "
        f"How many pages did {name} read in total?"
    )
    return question, pages * days + extra


def _pencil_boxes(rng: random.Random) -> Problem:
    name = rng.choice(_NAMES)
    per_box, boxes = rng.randint(4, 24), rng.randint(2, 9)
    lost = rng.randint(1, per_box * boxes)
    question = (
        f"A box holds {per_box} pencils. {name} fills {boxes} boxes and then loses {lost} "
        "pencils. How many pencils are left?"
    )
    return question, per_box * boxes - lost


def _pocket_money(rng: random.Random) -> Problem:
    name = rng.choice(_NAMES)
    had = rng.randint(10, 120)
    spent, earned = rng.randint(1, had), rng.randint(1, 60)
    question = (
        f"{name} had {had} dollars, spent {spent} dollars on lunch and then earned {earned} "
        f"dollars. How many dollars does {name} have now?"
    )
    return question, had - spent + earned


def _sharing(rng: random.Random) -> Problem:
    name = rng.choice(_NAMES)
    each, friends = rng.randint(2, 15), rng.randint(2, 8)
    eaten = rng.randint(1, each)
    question = (
        f"{name} shares {each * friends} cookies equally among {friends} friends, and each "
        f"friend eats {eaten} of them. How many cookies does each friend have left?"
    )
    return question, each - eaten


def _chairs(rng: random.Random) -> Problem:
    rows, per_row = rng.randint(2, 20), rng.randint(3, 15)
    taken = rng.randint(1, rows * per_row)
    question = (
        f"A hall has {rows} rows of {per_row} chairs. {taken} chairs are taken. "
        "How many chairs are free?"
    )
    return question, rows * per_row - taken


_WORD_PROBLEMS = (_buy_and_give, _reading, _pencil_boxes, _pocket_money, _sharing, _chairs)


def _level3(rng: random.Random) -> Problem:
    return rng.choice(_WORD_PROBLEMS)(rng)


_GENERATORS: dict[int, Callable[[random.Random], Problem]] = {1: _level1, 2: _level2, 3: _level3}


def level1_space() -> list[Problem]:
    """Every distinct level-1 problem (155 of them), in a fixed order."""
    problems = [_binary(a, "+", b) for a in range(10) for b in range(10)]
    problems += [_binary(a, "-", b) for a in range(10) for b in range(a + 1)]
    return problems


class ArithmeticTask:
    """Arithmetic problems of one level; samples are pure functions of (seed, level, i)."""

    name = "arith"

    def __init__(self, level: int = 1, seed: int = 0):
        """`level` in `LEVELS`; `seed` only affects the training stream."""
        if level not in LEVELS:
            raise ValueError(f"arith level must be one of {LEVELS}, got {level!r}")
        self.level = level
        self.seed = seed

    def _sample(self, sample_id: str, problem: Problem) -> dict:
        question, answer = problem
        return {
            "id": sample_id,
            "question": question,
            "answer": str(answer),
            "task": self.name,
            "level": self.level,
        }

    def train_sample(self, i: int) -> dict:
        """Training sample number `i` (i >= 0); never a held-out question."""
        if i < 0:
            raise ValueError(f"sample index must be >= 0, got {i}")
        # A str seed is hashed with sha512 by `random`, so this is stable across runs.
        rng = random.Random(f"{self.seed}-{self.level}-{i}")
        generate = _GENERATORS[self.level]
        while True:
            problem = generate(rng)
            if not is_heldout_question(problem[0]):
                return self._sample(f"arith-l{self.level}-s{self.seed}-{i}", problem)

    def heldout(self, n: int) -> list[dict]:
        """The first `n` held-out samples (a fixed list, the same for every seed).

        Level 1 has only ~30 held-out questions; asking for more returns all of
        them once, never repeats. Distinct questions only.
        """
        problems = self._heldout_problems(n)
        return [
            self._sample(f"arith-l{self.level}-heldout-{j}", problem)
            for j, problem in enumerate(problems)
        ]

    def _heldout_problems(self, n: int) -> list[Problem]:
        rng = random.Random(f"{_HELDOUT_SEED}-{self.level}")
        if self.level == 1:
            reserved = [p for p in level1_space() if is_heldout_question(p[0])]
            rng.shuffle(reserved)
            return reserved[: max(n, 0)]
        problems: list[Problem] = []
        seen: set[str] = set()
        generate = _GENERATORS[self.level]
        for _ in range(_MAX_HELDOUT_ATTEMPTS_PER_ITEM * max(n, 0)):
            if len(problems) >= n:
                break
            problem = generate(rng)
            if is_heldout_question(problem[0]) and problem[0] not in seen:
                seen.add(problem[0])
                problems.append(problem)
        return problems
