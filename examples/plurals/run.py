"""Plurals end to end, in one command: write the data, score the embedded model on the
held-out nouns, train it with GRPO, score it again (`examples/run_example.py`).

    python examples/plurals/run.py --seed 0 --run-dir /tmp/plurals-0

Any other flag is a trainer flag and overrides the ones below (`--steps 40`, `--grpo.lr 1e-4`),
or `--samples K` for pass@K too. The figures are printed and written to RUN_DIR/example.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: `examples` and the project

from examples.run_example import example_main  # noqa: E402

FLAGS = [  # beside the file task on cpu-demo (examples/run_example.py)
    # the held-out score: the `exact` verifier on the final `Answer:` line
    "--curriculum.verifier", "exact",
    # the reward: the right plural in that line, plus a small bonus for the line's shape
    "--reward.fn", "examples.plurals.rewards:correct_plural,examples.plurals.rewards:answer_line",
    "--reward.weights", "1,0.2",
    "--rollout.max_new_tokens", "32",
    "--steps", "80",
]

if __name__ == "__main__":
    sys.exit(example_main(HERE, FLAGS, sys.argv[1:]))
