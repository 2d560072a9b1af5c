"""Foundation layer: code that rollout workers, the learner and the launcher all need.

Imports nothing from `actors`, `learner` or `launch` (layers import one way).
"""

import logging

# bitsandbytes (imported by peft in every process that builds a model) warns on each import, on
# CPUs with avx512_bf16, that it could not fetch an optional kernel from the Hugging Face Hub
# and tells the user to `pip install kernels`, which would download code at run time. Its own
# fallback is what we use and test; the warning is noise in every actor's log.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
