"""TRL's GRPO quickstart, run by homerl: only the import line differs from TRL's script.

    python examples/trl_quickstart.py

TRL's documentation trains Qwen2-0.5B-Instruct on the trl-lib/tldr dataset from the Hub;
here the model is one embedded in homerl and the dataset is built in the script, so it runs
on a machine without Hub access (docs/tasks.md shows the two scripts side by side). The
reward is TRL's: completions close to 20 characters score best.
"""

from datasets import Dataset

from homerl import GRPOConfig, GRPOTrainer  # TRL: from trl import GRPOConfig, GRPOTrainer

posts = ["My cat knocks every glass off the table at 3 am. How do I make her stop?",
         "I got a job offer with more pay but a longer commute. Should I take it?",
         "Our team ships on Fridays and something always breaks. Is that normal?",
         "I want to learn piano at 35 but I have no time. Where do I start?"]
dataset = Dataset.from_dict({"prompt": [f"{p}\nTL;DR:" for p in posts] * 16})


# Define the reward function, which rewards completions that are close to 20 characters
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


training_args = GRPOConfig(output_dir="runs/SmolLM2-135M-GRPO", max_steps=20)
trainer = GRPOTrainer(
    model="smollm2-135m-instruct",
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
