"""Curriculum: stages of tasks the driver walks through, with optional early promotion.

A stage spec is `task:level[:steps][:style][@promote]`, comma-separated, e.g.

    --curriculum.stages "arith:1:20,arith:2:20,arith:3:20"      # fixed 20 steps each
    --curriculum.stages "arith:1:40@0.8,arith:2:40"             # leave stage 1 early once the
                                                                # rolling correct rate >= 0.8
    --curriculum.stages "gsm8k:0:100"                           # level is ignored for gsm8k
    --curriculum.stages "arith:1:30,arith:2:30:boxed"           # stage 2 asks for \boxed{N}
    --curriculum.stages "arith:1:20,file[data/mine.csv]:0:50"   # then a user's dataset
    --curriculum.stages "file:0:40"                             # curriculum.data_path

A `file` stage trains on a user's dataset (`tasks.file_task`): `file[PATH]` names it (the
brackets hold the path, which may contain ':', ',' and '@' but no brackets), a bare `file` means
`curriculum.data_path`. Every file stage reads its file with the curriculum's field mapping,
verifier, system prompt, instruction and held-out settings (`curriculum.prompt_field`, ...).

`style` is the answer line the stage's prompts ask for (`rewards.styles`: answer, the default
"Answer: N"; hash, "#### N"; boxed, "\boxed{N}"); its format bonus and strict accuracy check it.

With no stages the run has one stage made of `curriculum.task/level/data_path`. The stage of
step j is decided when its rollout is launched, from the rewards observed so far, so it is the
same in a resumed run. At a stage boundary the driver asks the learner to consolidate (EWC).

`curriculum.replay` = r > 0 (on-policy replay against forgetting): from stage 2 on, each of a
step's prompts is, with probability r, one an earlier stage trained on (stage and prompt drawn
uniformly, seeded by run seed and step, so a resumed run draws the same), generated fresh by
the current policy like any other prompt.

SENT (`curriculum.sent`) orders a stage's training prompts easy -> hard: for each of the first
`curriculum.sent_pool` prompts the rollout workers sample M = `curriculum.sent_samples`
completions at temperature 1, and the prompt's difficulty is the semantic entropy of its
answers (`answer_entropy`). The order is cached under `~/.cache/homerl/sent/` keyed by model,
task, level, data file, seed, M and pool size (a file stage's key also holds its path and the
curriculum's field mapping, verifier and prompts).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import os
import random
import sys
from dataclasses import dataclass

from tqdm import tqdm

from common.config import ConfigError
from common.model_cache import cache_dir
from common.types import Sampling
from rewards.styles import DEFAULT_STYLE, STYLES
from rewards.verifiers.python_tests import IsolationError, require_isolation
from tasks.file_task import FileOptions
from tasks.registry import make_task

CODE = "python-tests"
"""the verifier that runs the policy's code (rewards.verifiers.python_tests)"""

PROMOTION_WINDOW = 5
"""steps in the rolling mean of `reward/correct` that a promotion rule looks at"""


@dataclass(frozen=True)
class Stage:
    task: str
    level: int
    steps: int
    promote_at: float | None = None
    style: str = DEFAULT_STYLE
    data_path: str = ""
    """a file stage's dataset (`file[PATH]`; empty: curriculum.data_path)"""


STAGE_GRAMMAR = "task:level[:steps][:style][@promote] (task: arith, gsm8k, file or file[PATH])"


def split_specs(spec: str) -> list[str]:
    """`spec` split at the commas outside `[...]` (a file stage's path may hold commas)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += (ch == "[") - (ch == "]")
        if depth < 0 or depth > 1:
            raise ConfigError(f"curriculum.stages: unbalanced '[' ']' in {spec!r}; expected "
                              f"comma-separated {STAGE_GRAMMAR}")
        if ch == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"curriculum.stages: '[' without ']' in {spec!r}; a file stage is "
                          "file[PATH]:level[:steps]...")
    return [*parts, spec[start:]]


def parse_stage(part: str) -> Stage:
    """One stage spec (`STAGE_GRAMMAR`); ConfigError naming it when it is malformed."""
    text, path = part.strip(), ""
    if text.startswith("file["):
        close = text.index("]")
        path, rest = text[5:close].strip(), text[close + 1:]
        if not path or (rest and rest[0] not in ":@"):
            raise ConfigError(f"curriculum.stages: bad stage {part!r}; a file stage is "
                              "file[PATH][:level[:steps][:style]][@promote] with a non-empty PATH")
        text = "file" + rest
    head, _, promote = text.partition("@")
    fields = head.split(":")
    try:
        task, level = fields[0], int(fields[1]) if len(fields) > 1 and fields[1] else 1
        steps = int(fields[2]) if len(fields) > 2 and fields[2] else 0
        style = fields[3] if len(fields) > 3 else DEFAULT_STYLE
        promote_at = float(promote) if promote else None
        if len(fields) > 4 or (task != "file" and len(fields) > 1 and not fields[1]):
            raise ValueError
    except ValueError:
        raise ConfigError(f"curriculum.stages: bad stage {part!r}; expected {STAGE_GRAMMAR}"
                          ) from None
    if style not in STYLES:
        raise ConfigError(f"curriculum.stages: stage {part!r}: style {style!r}; allowed: "
                          f"{', '.join(STYLES)}")
    if task not in ("arith", "gsm8k", "file") or (task == "arith" and level not in (1, 2, 3)):
        raise ConfigError(f"curriculum.stages: stage {part!r}: task must be arith (level "
                          "1-3), gsm8k, file or file[PATH]")
    return Stage(task, level, steps, promote_at, style, path)


def parse_stages(spec: str, cfg) -> list[Stage]:
    """Parse `curriculum.stages`; empty spec -> one stage of cfg.curriculum for all steps."""
    cur, total = cfg.curriculum, cfg.run.steps
    if not spec.strip():
        return [Stage(cur.task, cur.level, total)]
    stages = [parse_stage(part) for part in split_specs(spec)]
    for s in stages:
        if s.task == "file" and not (s.data_path or cur.data_path):
            raise ConfigError("curriculum.stages: a stage 'file' with no path needs "
                              "curriculum.data_path; or name the dataset: file[PATH]")
    budgeted = sum(s.steps for s in stages)
    if budgeted > total:
        raise ConfigError(f"curriculum.stages: stages need {budgeted} steps, run.steps is {total}")
    if stages[-1].steps == 0 or budgeted < total:  # the last stage takes the remaining steps
        last = stages[-1]
        stages[-1] = dataclasses.replace(last, steps=last.steps + total - budgeted)
    return stages


def check_code_isolation(cfg, field: str = "curriculum.verifier") -> None:
    """python-tests runs the policy's code: refuse, in one line (naming `field`, the setting
    that asks for it) and before any actor starts, where the OS cannot isolate it, unless the
    user turned the isolation off."""
    try:
        require_isolation(cfg.reward.unsandboxed_code)
    except IsolationError as e:
        raise ConfigError(f"{field}: {e}") from None


def code_field(cfg, stages: list[Stage]) -> str | None:
    """The setting that makes python-tests score this run (a file stage's verifier, or
    reward.fn naming it), or None."""
    if any(s.task == "file" for s in stages) and cfg.curriculum.verifier == CODE:
        return "curriculum.verifier"
    return "reward.fn" if CODE in cfg.reward.fns() else None


def stage_task(cfg, stage: Stage):
    """The task a stage trains on (a file stage: its dataset with the curriculum's mapping)."""
    cur = cfg.curriculum
    return make_task(stage.task, stage.level, stage.data_path or cur.data_path or None,
                     cfg.run.seed, stage.style, file_options=FileOptions.from_config(cur))


class Curriculum:
    """Decides the stage and prompts of each step; its state is checkpointed by the driver."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.stages = parse_stages(cfg.curriculum.stages, cfg)
        self.tasks = [stage_task(cfg, s) for s in self.stages]
        if (field := code_field(cfg, self.stages)) is not None:
            check_code_isolation(cfg, field)
        self.orders: list[list[int] | None] = [None] * len(self.stages)  # SENT order per stage
        self.stage, self.stage_start = 0, 0
        self.trained = [0] * len(self.stages)  # training prompts each stage has used
        self.recent = collections.deque(maxlen=PROMOTION_WINDOW)

    def observe(self, correct_rate: float) -> None:
        """Record a trained step's correct rate (for promotion rules)."""
        self.recent.append(correct_rate)

    def _should_advance(self, step: int) -> bool:
        if self.stage + 1 >= len(self.stages):
            return False
        s = self.stages[self.stage]
        if step - self.stage_start >= s.steps:
            return True
        full = len(self.recent) == PROMOTION_WINDOW
        return (s.promote_at is not None and full
                and sum(self.recent) / PROMOTION_WINDOW >= s.promote_at)

    def prompts(self, step: int) -> tuple[int, list[dict]]:
        """(stage index, prompts) for step `step`; call in increasing step order."""
        if self._should_advance(step):
            self.stage, self.stage_start = self.stage + 1, step
            self.recent.clear()
        b = self.cfg.rollout.prompts_per_step
        base = (step - self.stage_start) * b
        order = self.orders[self.stage]
        idx = [base + i for i in range(b)]
        self.trained[self.stage] = max(self.trained[self.stage], base + b)
        if order is not None:  # SENT: walk the sorted pool, easy to hard, cycling
            idx = [order[i % len(order)] for i in idx]
        prompts = [self.tasks[self.stage].train_sample(i) for i in idx]
        return self.stage, self._replay(step, prompts)

    def _replay(self, step: int, prompts: list[dict]) -> list[dict]:
        """Swap each prompt, with probability curriculum.replay, for one an earlier stage
        trained on (see the module docstring)."""
        rate = self.cfg.curriculum.replay
        earlier = [s for s in range(self.stage) if self.trained[s]]
        if rate <= 0 or not earlier:
            return prompts
        rng = random.Random(f"replay-{self.cfg.run.seed}-{step}")
        out = []
        for p in prompts:
            if rng.random() < rate:
                s = rng.choice(earlier)
                i, order = rng.randrange(self.trained[s]), self.orders[s]
                p = self.tasks[s].train_sample(order[i % len(order)] if order else i)
            out.append(p)
        return out

    def state_dict(self) -> dict:
        return {"stage": self.stage, "stage_start": self.stage_start,
                "recent": list(self.recent), "orders": self.orders, "trained": self.trained}

    def load_state_dict(self, state: dict) -> None:
        self.stage, self.stage_start = state["stage"], state["stage_start"]
        self.recent = collections.deque(state["recent"], maxlen=PROMOTION_WINDOW)
        self.orders = state["orders"]
        self.trained = state.get("trained", [0] * len(self.stages))  # older checkpoints: none


# ---- SENT: semantic entropy of a prompt's sampled answers, easy -> hard ----------------------
# Completions are clustered by their verified, normalised final answer; the entropy of the
# cluster distribution is low when the model keeps giving one answer (easy or confidently
# wrong) and high when its answers scatter. A completion with no parsable answer is its own
# cluster: it carries no agreement with anything.

def answer_entropy(answers: list[str | None]) -> float:
    """Entropy (nats) of the distribution of `answers` over answer clusters; 0 for one cluster."""
    if not answers:
        raise ValueError("answer_entropy: needs at least one answer")
    counts = collections.Counter(a if a is not None else ("<none>", i)
                                 for i, a in enumerate(answers))
    n = len(answers)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def sent_order(entropies: list[float]) -> list[int]:
    """Indices sorted by entropy, lowest first; ties keep their original order (stable)."""
    return sorted(range(len(entropies)), key=lambda i: entropies[i])


CHUNK = 8
"""prompts per fan-out call (spread over the workers)"""


def cache_key(cfg, stage) -> str:
    c = cfg.curriculum
    parts = [cfg.model.name, stage.task, str(stage.level), c.data_path, str(cfg.run.seed),
             str(c.sent_samples), str(c.sent_pool)]
    if stage.task == "file":  # what the prompts are made of
        parts += [stage.data_path or c.data_path, c.prompt_field, c.answer_field, c.verifier,
                  c.system_prompt, c.instruction, c.heldout_path, str(c.heldout_size),
                  str(c.heldout_seed), stage.style]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def stage_order(pool, task, cfg, stage) -> tuple[list[int], bool]:
    """(training-sample indices sorted easy -> hard, whether it came from the cache)."""
    path = os.path.join(cache_dir(), "sent", f"{cache_key(cfg, stage)}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["order"], True
    n, m = cfg.curriculum.sent_pool, cfg.curriculum.sent_samples
    samples = [task.train_sample(i) for i in range(n)]
    entropies: list[float] = []
    desc = f"SENT {stage.task}-{stage.level}"
    for s in tqdm(range(0, n, CHUNK), desc=desc, unit="chunk", file=sys.stdout):
        chunk = samples[s: s + CHUNK]
        pending = pool.submit(-1, chunk, seed=cfg.run.seed * 7919 + s, group_size=m,
                              sampling=Sampling(temperature=1.0))
        summary = pool.collect(pending).summary  # the batches are never fetched
        by_prompt: dict[int, list] = {i: [] for i in range(len(chunk))}
        for i, ans in zip(summary.prompt_index, summary.answers):
            by_prompt[i].append(ans)
        # A prompt the worker refused (too long) is hardest: it never gets picked early.
        entropies += [answer_entropy(a) if a else float("inf") for a in by_prompt.values()]
    order = sent_order(entropies)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"order": order, "entropies": [entropies[i] for i in order]}, f)
    os.replace(tmp, path)
    return order, False
