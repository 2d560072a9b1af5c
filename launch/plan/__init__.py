"""Planners: will a config fit, before anything loads (`python -m launch.plan`).

`card.py` plans the GPU memory of the learner (and of a rollout engine that takes turns with
it) phase by phase; `ram.py` plans each process's RAM on a CPU box and the host side of a GPU
run; `sizing.py` splits a CPU box's cores between the learner and rollout workers within the
RAM plan; `units.py` holds what they share.
"""
