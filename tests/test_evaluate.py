"""launch.evaluate: in process and split across Ray eval workers give the same answers."""

import json

import pytest
import ray
import torch
from conftest import own_lines, without_ray

from actors.eval_worker import load_for_eval
from launch.evaluate.__main__ import main
from launch.evaluate.saved_models import evaluate, evaluate_many
from tasks.registry import make_task

MODEL = "tiny-random-llama"


def test_sharded_evaluation_matches_in_process(ray_cluster):
    torch.set_num_threads(1)  # the workers decode with 1 thread; same kernels, same greedy tokens
    samples = make_task("arith", 1).heldout(6)
    model, tok = load_for_eval(MODEL, torch.float32)
    local = evaluate(model, tok, samples, max_new_tokens=8, batch_size=1)
    (row,) = evaluate_many([MODEL], {"arith-1": samples}, torch.float32, 8, 1, workers=3)
    par = row["sets"]["arith-1"]
    assert par["workers"] == 3
    # 6 samples over 3 shards: the first 3 examples span shards 0 and 1, so a shard put back
    # in the wrong order changes them.
    assert par["examples"] == local["examples"]
    for key in ("n", "accuracy", "format_rate", "mean_completion_tokens"):
        assert par[key] == local[key], key


def test_cli_bad_input_is_one_line_and_a_cluster_it_starts_is_left(capsys, own_ray):
    capsys.readouterr()  # drop what an earlier test's Ray workers still printed
    assert main(["--model", MODEL, "--workers", "-1"]) == 2
    assert main(["--model", "no/such-model-here", "--workers", "1"]) == 2
    err = without_ray(capsys.readouterr().err).splitlines()
    assert len(err) == 2 and "--workers" in err[0] and "no/such-model-here" in err[1]
    assert not ray.is_initialized()  # the bad model was caught before starting Ray
    # --workers 1 with no cluster: a local one for the evaluation, left when main returns
    assert main(["--model", MODEL, "--workers", "1", "--n", "2", "--max-new-tokens", "4"]) == 0
    assert not ray.is_initialized()


def test_cli_writes_result(tmp_path):
    out = tmp_path / "r.json"
    assert main(["--model", MODEL, "--n", "2", "--max-new-tokens", "4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["n"] == 2 and res["set"] == "arith-1" and "workers" not in res


def test_pass_at_k_by_hand():
    from launch.evaluate.scoring import pass_at_k

    assert pass_at_k(8, 0, 1) == 0.0 and pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(2 / 8)
    assert pass_at_k(8, 1, 8) == 1.0  # one right sample of 8: pass@8 = 1
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_score_separates_format_from_skill_on_hand_made_completions():
    from launch.evaluate.scoring import score

    samples = [{"question": f"q{i}", "answer": a} for i, a in enumerate(["5", "7", "9", "4"])]
    texts = ["2 + 3 = 5\nAnswer: 5",   # right, in format
             "3 + 4 = 7\nAnswer: 7\nok",  # right, answer line not last: tagged but not strict
             "Answer: 8",              # wrong, in format
             "no idea"]                # wrong, no format
    sampled = [["Answer: 5"] * 8,                                  # 8 of 8 right
               ["Answer: 7"] + ["Answer: 1"] * 7,                  # 1 of 8
               ["Answer: 1"] * 8,                                  # 0 of 8
               ["Answer: 4", "Answer: 4"] + ["nothing"] * 6]       # 2 of 8
    out = score(samples, texts, [4, 4, 2, 2], 1.0, sampled)
    assert out["accuracy"] == pytest.approx(2 / 4)
    assert out["strict_accuracy"] == pytest.approx(1 / 4)
    assert out["format_rate"] == pytest.approx(2 / 4)
    assert out["tagged_accuracy"] == pytest.approx(2 / 4)
    assert out["tag_rate"] == pytest.approx(3 / 4)
    assert out["pass@1"] == pytest.approx((8 + 1 + 0 + 2) / 32)
    assert out["pass@8"] == pytest.approx(3 / 4)
    assert out["samples"] == 8 and out["n"] == 4 and out["mean_completion_tokens"] == 3
    assert len(out["examples"]) == 3 and {e["correct"] for e in out["examples"]} <= {True, False}
    # samples for the first two questions only (the demo's PASS_N): pass@k over those two
    part = score(samples, texts, [4, 4, 2, 2], 1.0, sampled[:2])
    assert part["pass_n"] == 2 and part["accuracy"] == out["accuracy"]
    assert part["pass@1"] == pytest.approx((8 + 1) / 16) and part["pass@8"] == 1.0


def test_evaluations_in_one_process_share_one_verifier_process():
    """An evaluation scores with its process's verifier (`shared_pool`), which the first one
    starts: the next one starts none (each used to start a process of its own, ~1 s)."""
    from launch.evaluate.scoring import score
    from rewards.sandbox.pool import shared_pool

    samples = [{"question": "q0", "answer": "5"}]
    score(samples, ["Answer: 5"], [2], 1.0)
    pool = shared_pool()
    pid, starts = pool.pid, pool.starts
    assert pid is not None  # started, and still running after the evaluation
    assert score(samples, ["Answer: 6"], [2], 1.0)["accuracy"] == 0.0
    assert shared_pool() is pool and (pool.pid, pool.starts) == (pid, starts)


def test_sampled_completions_are_graded_in_each_question_s_style():
    """pass@k asks what greedy accuracy asks: for a `words` question a digit answer is wrong."""
    from launch.evaluate.scoring import score

    samples = [{"question": "q0", "answer": "7", "style": "words"},
               {"question": "q1", "answer": "7"}]
    texts = ["Answer: seven", "Answer: seven"]
    sampled = [["Answer: 7"] * 6 + ["Answer: seven"] * 2,   # 2 of 8 in words
               ["Answer: 7"] * 6 + ["Answer: seven"] * 2]   # 6 of 8 in digits
    out = score(samples, texts, [2, 2], 1.0, sampled)
    assert out["accuracy"] == pytest.approx(1 / 2)  # the greedy words answer only
    assert out["pass@1"] == pytest.approx((2 + 6) / 16)


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_user_file_of_200_lines_is_scored_line_by_line(tmp_path):
    lines = [json.dumps({"question": f"What is {i} + 1?", "answer": i + 1}) for i in range(100)]
    lines += [json.dumps({"question": f"Q{i}", "answer": f"work...\n#### {i}"})
              for i in range(99)]
    lines += [json.dumps({"question": "Half of 7?", "answer": "3.5"}), ""]  # blank: skipped
    path = _write(tmp_path / "mine.jsonl", lines)
    out = tmp_path / "r.json"
    assert main(["--model", MODEL, "--data", path, "--max-new-tokens", "4",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["set"] == "mine" and res["n"] == 200


@pytest.mark.parametrize("line,want", [
    ('{"question": "What is 1+1?"}', "mine.jsonl:3: field 'answer'"),
    ('{"question": "", "answer": 2}', "mine.jsonl:3: field 'question'"),
    ('{"question": "Q", "answer": "two"}', "mine.jsonl:3: field 'answer'"),
    ('{"question": "Q", "answer": 2', "mine.jsonl:3: not a JSON object"),
    ('[1, 2]', "mine.jsonl:3: not a JSON object"),
])
def test_broken_user_file_is_a_one_line_error_naming_the_line(tmp_path, capsys, line, want):
    good = json.dumps({"question": "What is 2+2?", "answer": 4})
    path = _write(tmp_path / "mine.jsonl", [good, good, line, good])
    capsys.readouterr()
    assert main(["--model", MODEL, "--data", path]) == 2
    err = capsys.readouterr().err
    ours = own_lines(err, "launch.evaluate")
    assert len(ours) == 1 and want in ours[0] and "Traceback" not in err, err


def test_seen_and_unseen_sets_with_samples(tmp_path):
    out = tmp_path / "r.json"
    assert main(["--model", MODEL, "--sets", "arith-1,arith-1-unseen", "--n", "3",
                 "--max-new-tokens", "4", "--samples", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert set(row["sets"]) == {"arith-1", "arith-1-unseen"}
    for res in row["sets"].values():
        assert res["n"] == 3 and res["samples"] == 2 and 0 <= res["pass@1"] <= res["pass@2"]


def test_demo_runs_end_to_end_on_the_tiny_preset_and_resumes_after_a_stop(tmp_path, ray_cluster,
                                                                        capfd, monkeypatch):
    """Both evaluations on the run's rollout worker; the console holds the demo's lines and the
    table, the actors' logs do not reach it (also not the last lines Ray forwards as a demo's
    own cluster ends: the first part runs as `python -m launch.demo`). Stopped during training
    (RUN_DIR/STOP, as Ctrl-C stops it), the demo keeps its checkpoint and the base scores;
    --resume trains the steps left and compares with those scores. A learner killed in the
    resumed part is restored from its checkpoint, as in launch.train, and the demo scores the
    restored run's policy."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    import launch.demo
    from launch.demo import main as demo
    from launch.driver.trainer import Trainer

    class KillsTheLearnerOnce(Trainer):
        def step(self, k):
            if k == 5 and self.learner_restarts == 0:
                os.kill(ray.get(self.learner.placement.remote())["pid"], signal.SIGKILL)
            return super().step(k)

    run = tmp_path / "run"

    def stop_after_the_first_row():
        rows = run / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (rows.exists() and rows.read_text()):
            time.sleep(0.02)
        (run / "STOP").touch()

    stopper = threading.Thread(target=stop_after_the_first_row, daemon=True)
    stopper.start()
    proc = subprocess.run([sys.executable, "-m", "launch.demo", "--preset", "tiny", "--steps",
                           "12", "--run.eval_n", "3", "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RAY_ADDRESS": ""})
    stopper.join()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert f'(RUN_DIR/STOP); go on with: make demo ARGS="--resume {run}"' in text
    assert "pid=" not in text  # left its cluster inside the quiet console
    capfd.readouterr()
    assert not (run / "demo.json").exists()
    before = json.loads((run / "demo-before.json").read_text())
    monkeypatch.setattr(launch.demo, "Trainer", KillsTheLearnerOnce)
    assert demo(["--resume", str(run)]) == 0
    captured = capfd.readouterr()
    text = captured.out + captured.err
    assert "resuming the run from its last checkpoint" in text and "base seen" not in text
    assert "seen (n=3)" in text and "unseen (n=3)" in text and "pass@8" in text
    assert text.count("[seen] Q:") == 3 and text.count("[unseen] Q:") == 3
    assert "scored by transformers generate" in text and "demo.log" in text
    assert "pid=" not in text  # Ray's forwarded actor lines: "(Learner pid=...)"
    result = json.loads((run / "demo.json").read_text())
    assert result["before"] == before and result["train"]["steps"] == 12
    assert result["before"]["seen"]["samples"] == 8 and result["engine"] == "transformers generate"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(12))  # each step once across the stop
    assert result["train"]["learner_restarts"] == 1 and rows[-1]["faults/learner_restarts"] == 1
    assert (run / "demo.log").exists()


def test_quiet_console_keeps_library_output_in_the_log(tmp_path, capfd):
    """Python warnings, writes to file descriptor 2 (C libraries, child processes) and other
    loggers go to the log; the job's lines and homerl's warnings to the terminal."""
    import logging
    import os
    import sys
    import warnings

    from launch.console import QuietConsole

    log = tmp_path / "job.log"
    capfd.readouterr()
    with QuietConsole(str(log)) as console:
        console.say("job line")
        os.write(2, b"C library noise\n")
        print("stray print", file=sys.stderr, flush=True)
        warnings.warn_explicit("deprecated thing", UserWarning, "lib.py", 1,
                               registry={})
        logging.getLogger("homerl.test").warning("a worker was replaced")
        logging.getLogger("somelib").error("a library says something")
        os.system("echo child process output")
    print("after", flush=True)
    captured = capfd.readouterr()
    shown, kept = captured.out + captured.err, log.read_text()
    assert "job line" in shown and "a worker was replaced" in shown and "after" in shown
    for noise in ("C library noise", "stray print", "deprecated thing", "a library says something",
                  "child process output"):
        assert noise in kept and noise not in shown, noise
    with QuietConsole(str(tmp_path / "v.log"), verbose=True) as console:  # --verbose
        os.write(2, b"shown when verbose\n")
    assert "shown when verbose" in capfd.readouterr().err
    assert not (tmp_path / "v.log").exists()


def test_demo_warns_when_the_format_was_learned_and_accuracy_lost():
    """Seed 1 of the recipe: format 1% -> 100%, accuracy 39.5% -> 35%: the demo must say so."""
    from launch.demo import warnings_for

    base = {"seen": {"accuracy": 0.395, "format_rate": 0.01},
            "unseen": {"accuracy": 0.21, "format_rate": 0.06}}
    collapsed = {"seen": {"accuracy": 0.35, "format_rate": 1.0},
                 "unseen": {"accuracy": 0.195, "format_rate": 1.0}}
    learned = {"seen": {"accuracy": 0.84, "format_rate": 1.0},
               "unseen": {"accuracy": 0.605, "format_rate": 0.985}}
    lines = warnings_for(base, collapsed)
    assert len(lines) == 2 and lines[0].startswith("note: on seen, format 1% -> 100%")
    assert warnings_for(base, learned) == []
