"""Plurals end to end, in one command: write the data, score the embedded model on the
held-out nouns, train it with GRPO, score it again (`examples/run_example.py`).

    python examples/plurals/run.py --seed 0 --run-dir /tmp/plurals-0

Any other flag is a trainer flag and overrides the ones below (`--steps 40`, `--grpo.lr 1e-4`),
or `--samples K` for pass@K too. The figures are printed and written to RUN_DIR/example.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = HERE / "data"

FLAGS = [
    "--preset", "cpu-demo",
    "--curriculum.task", "file",
    "--curriculum.data_path", str(DATA / "train.jsonl"),
    "--curriculum.heldout_path", str(DATA / "heldout.jsonl"),
    # the held-out score: the `exact` verifier on the final `Answer:` line
    "--curriculum.verifier", "exact",
    # the reward: the right plural in that line, plus a small bonus for the line's shape
    "--reward.fn", "examples.plurals.rewards:correct_plural,examples.plurals.rewards:answer_line",
    "--reward.weights", "1,0.2",
    "--rollout.max_new_tokens", "32",
    "--steps", "80",
]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)  # the reward module imports as examples.plurals.rewards from here
    from examples.plurals import make_data
    from examples.run_example import run

    make_data.main([str(DATA)])
    return run(FLAGS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
