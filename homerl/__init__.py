"""homerl: GRPO for small language models on a CPU box, one small GPU or a Ray cluster.

The public interface, in TRL's shape (everything not exported here is internal):

    from homerl import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) for c in completions]

    trainer = GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=reward_len,
                          args=GRPOConfig(output_dir="runs/len", max_steps=20),
                          train_dataset=dataset)
    trainer.train()

- `GRPOConfig`: TRL's field names, the `preset` every unset field comes from, and any homerl
  setting as a `"section.field"` keyword (`Config`, `PRESETS`, `get_preset`).
- `GRPOTrainer`: model name or path, reward functions (callables from a script or notebook,
  `module:function` strings, built-in verifier names in `VERIFIERS`), a Dataset or list of
  dicts, a `peft.LoraConfig`; `train()`, `save_model()`.
- `evaluate`, `score`: a model's held-out accuracy, completions checked by a verifier.
- `ConfigError`: what a setting homerl cannot run raises (one line naming it).
"""

from common.config import Config, ConfigError
from common.presets import PRESETS, get_preset
from common.task_config import VERIFIERS
from homerl.config import GRPOConfig
from homerl.scoring import evaluate, score
from homerl.trainer import GRPOTrainer

__all__ = ["PRESETS", "VERIFIERS", "Config", "ConfigError", "GRPOConfig", "GRPOTrainer",
           "evaluate", "get_preset", "score"]
