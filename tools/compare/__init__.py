"""homerl against its peers on the same machine: `bench.py` (`make bench`: throughput and memory
against TRL's GRPOTrainer), `time_to_accuracy.py` (`make bench-tta`; its results and report:
`tta_report.py`), `rollout_only.py` (the rollout engines alone), `settings.py` (the settings both
systems run with)."""
