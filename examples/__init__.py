"""Worked examples of training on your own data with your own reward functions: English
plurals (`plurals/`) and small Python functions checked by unit tests (`code/`); each has a
dataset builder, its reward functions in TRL's signature and a `run.py`."""
