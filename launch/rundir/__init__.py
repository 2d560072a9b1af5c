"""The run directory: every file a run writes and the rules that keep it whole.

`writer.py` writes config.json, metrics.jsonl, samples.jsonl, summary.json, curves.png and
wandb; `checkpoints.py` writes and reads checkpoints atomically (`ckpt-NNNNNN/`);
`ownership.py` says which directories are runs and lets one driver at a time write one;
`resume.py` decides what `--resume` reads from the run and what its flags may change.
"""
