"""`import homerl`: TRL's GRPOConfig names mapped onto homerl's Config (pure, no Ray), and
TRL's quickstart script run with only its import changed (a real local Ray cluster, the tiny
random Llama)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import homerl
from homerl import ConfigError, GRPOConfig
from homerl.config import to_config

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "trl_quickstart.py"


def config(**kwargs):
    return to_config(GRPOConfig(output_dir="/tmp/x", preset="tiny", **kwargs), rows=100)[0]


def test_trl_names_set_homerl_settings():
    cfg = config(learning_rate=1e-5, num_generations=4, max_completion_length=32, max_steps=7,
                 temperature=0.7, top_p=1.0, top_k=0, beta=0.04, epsilon=0.1, seed=3,
                 loss_type="grpo", scale_rewards="none", top_entropy_quantile=0.5,
                 mask_truncated_completions=True, save_steps=2, save_total_limit=1,
                 use_vllm=False, report_to="none", per_device_train_batch_size=4,
                 gradient_accumulation_steps=2)
    assert (cfg.grpo.lr, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (1e-5, 4, 32)
    assert (cfg.run.steps, cfg.run.seed, cfg.run.checkpoint_every) == (7, 3, 2)
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k) == (0.7, 1.0, 0)
    assert (cfg.grpo.eps_low, cfg.grpo.eps_high) == (0.1, 0.1)  # TRL: symmetric unless high
    assert (cfg.grpo.loss_agg, cfg.grpo.adv_scale, cfg.grpo.entropy_rho) == (
        "seq_mean", "none", 0.5)
    assert cfg.reward.overlong == "mask" and cfg.rollout.engine == "hf"
    # 4 x 2 completions per update, 4 per prompt: 2 prompts; micro-batches of 4
    assert (cfg.rollout.prompts_per_step, cfg.grpo.micro_batch) == (2, 4)
    assert cfg.run.run_dir == "/tmp/x" and cfg.run.wandb_project == ""


def test_unset_fields_keep_the_preset_and_dotted_keywords_set_any_field():
    tiny = homerl.get_preset("tiny")
    cfg = to_config(GRPOConfig(preset="tiny", **{"rollout.max_staleness": 0}))[0]
    assert cfg.rollout.max_staleness == 0 and cfg.grpo == tiny.grpo
    assert config(epsilon_high=0.3).grpo.eps_high == 0.3
    assert config(loss_type="dapo").grpo.loss_agg == "token_mean_all"


def test_num_train_epochs_sets_the_steps_from_the_rows():
    cfg = to_config(GRPOConfig(preset="tiny", num_train_epochs=2, generation_batch_size=16,
                               num_generations=8), rows=10)[0]
    assert cfg.rollout.prompts_per_step == 2 and cfg.run.steps == 10  # 2 x 10 rows / 2


@pytest.mark.parametrize("kwargs,names", [
    ({"warmup_ratio": 0.1}, "warmup_ratio"),
    ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type"),
    ({"num_iterations": 2}, "num_iterations"),
    ({"loss_type": "cispo"}, "loss_type"),
    ({"scale_rewards": "batch"}, "scale_rewards"),
    ({"report_to": "tensorboard"}, "report_to"),
    ({"vllm_mode": "server"}, "vllm_mode"),
    ({"dataloader_num_workers": 2}, "dataloader_num_workers"),
    ({"generation_batch_size": 12, "num_generations": 8}, "num_generations"),
    ({"rollout.nope": 1}, "rollout.nope"),
    ({"learning_rate": -1.0}, "learning_rate"),
    ({"top_p": 0.9}, "top_p"),
])
def test_an_unsupported_trl_field_is_one_line_naming_it(kwargs, names):
    with pytest.raises(ConfigError) as err:
        config(**kwargs)
    msg = str(err.value)
    assert "\n" not in msg and names in msg, msg


def test_trl_fields_at_what_homerl_does_are_accepted():
    cfg = config(adam_beta1=0.9, lr_scheduler_type="constant", warmup_ratio=0.0,
                 push_to_hub=False, num_iterations=1)
    assert cfg.grpo == homerl.get_preset("tiny").grpo


def test_reward_funcs_are_packed_by_value_and_strings_kept():
    from homerl.trainer import reward_specs
    from rewards.byvalue import unpack

    def length(completions, **kwargs):
        return [len(c) for c in completions]

    scale = 3
    specs, packed = reward_specs([length, "numeric", lambda completions, **kw:
                                  [scale * len(c) for c in completions], length])
    assert specs == ["by-value:length", "numeric", "by-value:reward", "by-value:length_2"]
    assert unpack(packed["reward"])(["ab"]) == [6]  # the closure's value travels with it
    with pytest.raises(ConfigError, match="reward_funcs: 'nope'"):
        reward_specs("nope")


def test_the_app_refuses_a_function_packed_by_value():
    from launch.app.policy import Policy, PolicyError

    with pytest.raises(PolicyError, match="by-value:length"):
        Policy().check_reward_fns(["by-value:length"])


def test_score_checks_completions_as_training_does():
    assert homerl.score(["6 x 7 = 42\nAnswer: 42", "Answer: 41"], ["42", "42"]) == [1.0, 0.0]
    assert homerl.score(["Answer: paris"], ["Paris"], verifier="exact") == [1.0]
    with pytest.raises(ConfigError, match="verifier: 'nope'"):
        homerl.score(["x"], ["y"], verifier="nope")


def test_evaluate_scores_a_model_on_rows_with_answers():
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    out = homerl.evaluate("tiny-random-llama", rows, n=3, max_new_tokens=4)
    assert out["n"] == 3 and 0.0 <= out["accuracy"] <= 1.0 and "format_rate" in out
    with pytest.raises(ConfigError, match="'answer' column"):
        homerl.evaluate("tiny-random-llama", [{"prompt": "hi"}])


def test_a_new_run_where_one_is_says_how_to_resume_it_in_python(tmp_path):
    from homerl.trainer import GRPOTrainer

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    trainer = GRPOTrainer(model="tiny-random-llama", reward_funcs="numeric",
                          args=GRPOConfig(output_dir=str(run), preset="tiny", max_steps=2),
                          train_dataset=[{"prompt": "1 + 1?", "answer": "2"}])
    with pytest.raises(ConfigError) as err:
        trainer.train()
    msg = str(err.value)
    assert "\n" not in msg and "output_dir" in msg and "resume_from_checkpoint=True" in msg, msg


def run_script(code: str, tmp_path: Path, timeout: int = 400) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=timeout)


@pytest.mark.slow
def test_trls_quickstart_trains_resumes_and_saves_a_peft_adapter(tmp_path):
    """The example, with the tiny model for 3 steps; then, in the same process, a new
    trainer resumes it to step 4 and saves an adapter that peft loads."""
    src = QUICKSTART.read_text()
    for old, new in [('model="smollm2-135m-instruct"', 'model="tiny-random-llama"'),
                     ('GRPOConfig(output_dir="runs/SmolLM2-135M-GRPO", max_steps=20)',
                      'GRPOConfig(output_dir="run", max_steps=3, preset="tiny")')]:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    src += """
import ray
assert not ray.is_initialized()  # the cluster train() started is gone
args = GRPOConfig(output_dir="run", max_steps=4, preset="tiny", resume_from_checkpoint=True)
out = GRPOTrainer(model="tiny-random-llama", reward_funcs=reward_len, args=args,
                  train_dataset=dataset).train()
print("GLOBAL_STEP", out.global_step)
trainer = GRPOTrainer(model="tiny-random-llama", reward_funcs=reward_len, args=args,
                      train_dataset=dataset)
print("SAVED", trainer.save_model("adapter"))
from peft import AutoPeftModelForCausalLM
model = AutoPeftModelForCausalLM.from_pretrained("adapter")
print("LOADED", type(model).__name__)
"""
    proc = run_script(src, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GLOBAL_STEP 4" in proc.stdout and "LOADED PeftModelForCausalLM" in proc.stdout
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    history = [json.loads(line)["event"] for line in
               (run / "config-history.jsonl").read_text().splitlines()]
    assert history == ["start", "resume"]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    # TRL's reward_len ran in the verifier processes, by value: -|20 - len(completion)|
    assert samples and all(s["fn"]["reward_len"] == -abs(20 - len(s["completion"]))
                           for s in samples)
    assert all(s["question"].endswith("TL;DR:") for s in samples)  # the prompt as it stands
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["reward"]["fn"] == "by-value:reward_len" and cfg["run"]["steps"] == 4
    assert (run / "reward_fns" / "reward_len.pkl").exists()
    assert cfg["curriculum"]["data_path"] == str(run / "data" / "train.parquet")


@pytest.mark.slow
def test_a_lambda_on_a_conversational_dataset_and_ctrl_c_then_train_again(tmp_path):
    """A closure-capturing lambda on chat prompts; a Ctrl-C (SIGINT from a callback, as a
    notebook's interrupt sends it) after step 1 checkpoints and raises KeyboardInterrupt; the
    next train() of the same trainer finishes the run."""
    proc = run_script("""
import os, signal
from transformers import TrainerCallback
from homerl import GRPOConfig, GRPOTrainer

modulus = 7
dataset = [{"prompt": [{"role": "user", "content": f"Name a number near {i}."}], "hint": i}
           for i in range(12)]

class Interrupt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1 and not os.path.exists("interrupted"):
            open("interrupted", "w").close()
            os.kill(os.getpid(), signal.SIGINT)

trainer = GRPOTrainer(
    model="tiny-random-llama",
    reward_funcs=lambda completions, hint, **kw: [len(c[0]["content"]) % modulus + h
                                                  for c, h in zip(completions, hint)],
    args=GRPOConfig(output_dir="chat", max_steps=3, preset="tiny", logging_steps=1),
    train_dataset=dataset, callbacks=[Interrupt])
try:
    trainer.train()
except KeyboardInterrupt:
    print("INTERRUPTED")
out = trainer.train()
print("GLOBAL_STEP", out.global_step, "LOGGED", len(trainer.state.log_history))
""", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "INTERRUPTED" in proc.stdout and "GLOBAL_STEP 3" in proc.stdout, proc.stdout
    assert "stopping after this step" in proc.stderr
    # the signal is handled inside the callback of step 1, so the run stops right after it
    assert "homerl: stopped at step 1 (Ctrl-C): checkpoint saved" in proc.stderr, proc.stderr
    run = tmp_path / "chat"
    assert (run / "ckpt-000002").is_dir()  # the end of the run is a checkpoint
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # nothing redone, nothing lost
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    hints = {f"Name a number near {i}.": i for i in range(12)}
    assert samples and all(s["fn"]["reward"] == len(s["completion"]) % 7 + hints[s["question"]]
                           for s in samples)
