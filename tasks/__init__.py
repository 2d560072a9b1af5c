"""Tasks: what a run trains and evaluates on, as plain sample dicts (a layer between the rewards
and the roles: it reads datasets and writes prompts; the rewards package scores the replies).

* `registry.py`: `make_task(name, ...)` ("arith", "gsm8k", "file") and the `Task` protocol;
* `prompts.py`: the prompt text of a sample (chat template, system message, instruction);
* `arith.py` and `phrasings.py`: procedural arithmetic in three levels and many phrasings;
* `gsm8k.py`: GSM8K from a local JSONL file (or the Hub);
* `file_task.py` and `file_rows.py`: a user's own dataset (JSONL, CSV, Parquet, a `datasets`
  folder), its field mapping and its held-out split; `eval_file.py`: a user's own evaluation
  file;
* `epochs.py`: the seeded training order, reshuffled each epoch, of the datasets.
"""


class DatasetError(Exception):
    """A dataset is missing, unreachable, malformed, or has no usable rows."""
