"""File tasks as curriculum stages, trained end to end, and scored by
launch.evaluate (the loading, mapping and splitting of the files: tests/test_filetask.py)."""

import json

import pytest
from conftest import own_lines

from common.config import ConfigError
from common.presets import get_preset
from launch.driver.curriculum import Curriculum, parse_stages
from tasks.file_task import FileOptions, FileTask

try:  # tests/ as a package, or as a plain directory on sys.path
    from tests.test_filetask import QUESTIONS, file_of, rows, write_csv
except ImportError:
    from test_filetask import QUESTIONS, file_of, rows, write_csv


# -- curriculum stages -----------------------------------------------------------------------

def test_file_stage_path_may_hold_colons_and_commas(tmp_path):
    folder = tmp_path / "a:b,c@d"
    folder.mkdir()
    path = write_csv(folder / "data.csv", rows())
    cfg = get_preset("tiny")
    cfg.run.steps, cfg.curriculum.replay, cfg.curriculum.heldout_size = 6, 0.0, 4
    cfg.curriculum.stages = f"arith:1:2,file[{path}]:0:3@0.9,file:0"
    cfg.curriculum.data_path = path
    stages = parse_stages(cfg.curriculum.stages, cfg)
    assert [(s.task, s.steps, s.data_path, s.promote_at) for s in stages] == [
        ("arith", 2, "", None), ("file", 3, path, 0.9), ("file", 1, "", None)]
    cur = Curriculum(cfg)
    got = [cur.prompts(k)[1] for k in range(3)]
    assert all(p["task"] == "arith" for p in got[0]) and got[2][0]["task"] == "file"
    assert {p["question"] for p in got[2]} <= set(QUESTIONS)
    held = {s["question"] for s in cur.tasks[1].heldout(10)}
    assert len(held) == 4 and held.isdisjoint(p["question"] for p in got[2])


@pytest.mark.parametrize("spec,msg", [
    ("file[]:0:2", "non-empty PATH"), ("file[x.csv", "without ']'"),
    ("file[x.csv]y:0", "file[PATH]"), ("file[a]]:0", "unbalanced"), ("file:0:2", "data_path"),
    ("file[x]:0:2:nostyle", "style 'nostyle'"), ("arith::2", "bad stage"),
])
def test_bad_file_stage_specs_are_one_line_config_errors(spec, msg):
    cfg = get_preset("tiny")
    cfg.run.steps = 10
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")) as e:
        parse_stages(spec, cfg)
    assert "\n" not in str(e.value)


def test_sent_cache_key_of_a_file_stage_holds_its_path_and_mapping():
    from launch.driver.curriculum import cache_key, parse_stage

    cfg = get_preset("tiny")
    a, b = parse_stage("file[a.csv]:0:5"), parse_stage("file[b.csv]:0:5")
    assert cache_key(cfg, a) != cache_key(cfg, b)
    before = cache_key(cfg, a)
    cfg.curriculum.prompt_field = "problem"
    assert cache_key(cfg, a) != before
    arith = parse_stage("arith:1:5")
    assert cache_key(cfg, arith) == cache_key(get_preset("tiny"), arith)  # unchanged


# -- end to end ------------------------------------------------------------------------------

# Two runs: a CSV of plain prompts (answers read as text) and a save_to_disk folder of chat
# prompts (typed answers). Parquet reads into the same rows as these (test_filetask.py's loading
# test covers all four formats), so a third run (a Trainer start, ~20 CPU-s) would add nothing.
@pytest.mark.parametrize("kind", ["csv", "disk"])
def test_a_tiny_run_trains_on_a_csv_and_on_a_chat_dataset_folder(tmp_path, kind, ray_cluster,
                                                                 capsys):
    from launch.train import main

    items = rows()
    if kind == "disk":  # a chat dataset, with the system prompt and instruction flags
        items = [{"messages": [{"role": "user", "content": r["question"]}],
                  "answer": r["answer"]} for r in items]
    path = file_of(tmp_path, kind, items)
    run = tmp_path / "run"
    assert main(["--preset", "tiny", "--steps", "2", "--curriculum.task", "file",
                 "--curriculum.data_path", path, "--curriculum.heldout_size", "6",
                 "--curriculum.system_prompt", "You add numbers.", "--run.sample_every", "1",
                 "--run-dir", str(run)]) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all(m["rollout/tokens"] > 0
                                                          for m in metrics)
    trained = {json.loads(line)["question"] for line in
               (run / "samples.jsonl").read_text().splitlines()}
    held = {s["question"] for s in FileTask(path, FileOptions(heldout_size=6)).heldout(6)}
    assert trained and trained <= set(QUESTIONS) and trained.isdisjoint(held)
    config = json.loads((run / "config.json").read_text())
    assert config["curriculum"]["data_path"] == path


def test_evaluate_scores_the_file_task_s_heldout_split(tmp_path):
    from launch.evaluate.__main__ import main

    path = write_csv(tmp_path / "mine.csv", [{"problem": r["question"], "solution": r["answer"]}
                                             for r in rows()])
    out = tmp_path / "r.json"
    assert main(["--model", "tiny-random-llama", "--task", "file", "--data", path,
                 "--prompt-field", "problem", "--answer-field", "solution",
                 "--heldout-size", "5", "--heldout-seed", "2", "--max-new-tokens", "4",
                 "--workers", "0", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    held = FileTask(path, FileOptions(prompt_field="problem", answer_field="solution",
                                      heldout_size=5, heldout_seed=2)).heldout(5)
    assert res["set"] == "mine" and res["n"] == 5
    assert {e["question"] for e in res["examples"]} <= {s["question"] for s in held}


def test_evaluate_file_task_errors_are_one_line(tmp_path, capsys):
    from launch.evaluate.__main__ import main

    path = write_csv(tmp_path / "mine.csv", rows(4))
    capsys.readouterr()
    assert main(["--model", "tiny-random-llama", "--task", "file", "--data", path,
                 "--prompt-field", "nope", "--workers", "0"]) == 2
    assert main(["--model", "tiny-random-llama", "--task", "file", "--workers", "0"]) == 2
    err = own_lines(capsys.readouterr().err, "launch.evaluate")
    assert len(err) == 2 and "no column 'nope'" in err[0] and "--data" in err[1], err
