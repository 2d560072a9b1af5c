"""The rollout side: workers that generate G completions per prompt and verify them.

`base.py` is the one worker interface; `hf_worker.py` (transformers' generate) and
`vllm_worker.py` (vLLM, through its one adapter `vllm_engine.py` and `vllm_setup.py`) implement
it; `prompts.py` encodes a call's prompts, `sampling.py` decides what is sampled (on-policy),
`rollout_batch.py` turns samples into a verified batch; `weights.py`, `lora_merge.py` and
`adapter_files.py` load the learner's pushed weights; `eval_worker.py` decodes for evaluation."""
