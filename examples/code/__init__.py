"""Worked example: small Python functions, checked by running their unit tests (the
python-tests verifier) plus reward functions in TRL's signature; README.md says how to run it."""
