"""The held-out sets `launch.evaluate` scores: built-in sets by name, a user's JSONL file line by
line, or the held-out split of a user's dataset (`--task file`, `tasks.file_task`).

    python -m launch.evaluate --model runs/<run>/final --task file --data mine.csv \
        --prompt-field problem --answer-field solution --heldout-size 50

`--task file` takes the flags of the training run's `curriculum` fields (`--prompt-field`,
`--answer-field`, `--verifier`, `--system-prompt`, `--instruction`, `--heldout-path`,
`--heldout-size`, `--heldout-seed`): given the same values, it scores the very prompts that
training held out.
"""

from __future__ import annotations

import os

from common.task_config import VERIFIERS
from rewards.styles import STYLES
from tasks import DatasetError
from tasks.eval_file import read_eval_file
from tasks.file_task import FileOptions
from tasks.registry import make_task

SET_NAMES = ("arith-1", "arith-2", "arith-3", "arith-1-unseen", "arith-2-unseen",
             "arith-3-unseen", "gsm8k")


def heldout_sets(spec: str, n: int, data: str | None) -> dict[str, list[dict]]:
    """Parse `arith-1,arith-1-unseen,gsm8k,arith-2-boxed` into named held-out sets of up to n
    problems; a set name may end in an answer style (`rewards.styles`)."""
    sets = {}
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        base, _, style = name.rpartition("-")
        if style not in STYLES or base not in SET_NAMES:
            base, style = name, None
        if base not in SET_NAMES:
            raise ValueError(f"--sets: {name!r} must be one of {', '.join(SET_NAMES)}, "
                             f"optionally ending in -STYLE ({', '.join(STYLES)})")
        if base == "gsm8k":
            sets[name] = make_task("gsm8k", 0, data, style=style).heldout(n)
            continue
        level, split = int(base.split("-")[1]), "unseen" if base.endswith("unseen") else "seen"
        sets[name] = make_task("arith", level, style=style).heldout(n, split)
    return sets


def add_file_flags(p) -> None:
    """The `--task file` flags: the training run's curriculum fields of the same names."""
    d = FileOptions()
    p.add_argument("--prompt-field", default=d.prompt_field,
                   help="--task file: the prompt column (auto: messages, prompt, question or "
                        "problem, the first present)")
    p.add_argument("--answer-field", default=d.answer_field,
                   help="--task file: the reference column (empty: none)")
    p.add_argument("--verifier", default=d.verifier, choices=VERIFIERS,
                   help="--task file: how answers are checked")
    p.add_argument("--system-prompt", default=d.system_prompt,
                   help="--task file: a system message before every prompt")
    p.add_argument("--instruction", default=d.instruction,
                   help="--task file: text after every prompt (empty: the verifier's)")
    p.add_argument("--prompt-as-is", action="store_true",
                   help="--task file: each prompt as the file holds it, nothing added (TRL's "
                        "convention; a run from homerl.GRPOTrainer trains so)")
    p.add_argument("--heldout-path", default=d.heldout_path,
                   help="--task file: a file of held-out prompts (empty: split off --data)")
    p.add_argument("--heldout-size", type=int, default=d.heldout_size,
                   help="--task file: prompts split off --data, as in training")
    p.add_argument("--heldout-seed", type=int, default=d.heldout_seed,
                   help="--task file: the seed of that split, as in training")


def file_set(args) -> dict[str, list[dict]]:
    """`--task file`: up to --n prompts of the held-out split of --data, named by its file."""
    if not args.data:
        raise ValueError("--task file: name your dataset with --data PATH")
    if args.heldout_size < 0:
        raise ValueError(f"--heldout-size: must be >= 0; got {args.heldout_size}")
    opts = FileOptions(args.prompt_field, args.answer_field, args.verifier, args.system_prompt,
                       args.instruction, args.heldout_path, args.heldout_size, args.heldout_seed,
                       args.prompt_as_is)
    samples = make_task("file", data_path=args.data, file_options=opts).heldout(args.n)
    if not samples:
        raise DatasetError(f"{args.data}: no held-out prompts to score (--heldout-size 0 and no "
                           "--heldout-path)")
    return {os.path.splitext(os.path.basename(os.path.normpath(args.data)))[0]: samples}


def requested_sets(args) -> dict[str, list[dict]]:
    """The sets the CLI asks for: --sets, else a user's --data file, else --task/--level."""
    if args.sets:
        return heldout_sets(args.sets, args.n, args.data)
    if args.task == "file":
        return file_set(args)
    if args.data and args.task is None:
        return {os.path.splitext(os.path.basename(args.data))[0]: read_eval_file(args.data)}
    if args.task == "gsm8k":
        return heldout_sets("gsm8k", args.n, args.data)
    return heldout_sets(f"arith-{args.level}", args.n, None)
