"""Measurements of homerl's own parts: decode against the roofline (`decode_profile.py`,
`roofline.py`), the learner's step (`learner_step.py`), per-core throughput and the cost model
of a bigger box (`cores.py`, `cost_model.py`), memory against the RAM plan
(`memory_table.py`), the parsers' worst cases (`parsers.py`), real-shaped random models
(`shape_model.py`)."""
