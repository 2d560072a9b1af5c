"""The card check (`python -m tools.card_check`, __main__.py): the gpu-8gb step on a bare GPU
box. `ours.py` runs the one-copy steps in a process of their own, `two_process.py` the
time-sliced layout, `trl_side.py` TRL's GRPOTrainer at the same cap, `nf4.py` compares the
CPU's and the card's 4-bit kernels."""
