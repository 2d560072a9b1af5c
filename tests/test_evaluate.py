"""launch.evaluate: in process and split across Ray eval workers give the same answers."""

import json

import ray
import torch

from launch.evaluate import evaluate, evaluate_many, load_for_eval, main
from rewards import make_task

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


def test_cli_bad_workers_and_missing_model_are_one_line_errors(capsys, own_ray):
    capsys.readouterr()  # drop what an earlier test's Ray workers still printed
    assert main(["--model", MODEL, "--workers", "-1"]) == 2
    assert main(["--model", "no/such-model-here", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--workers" in err[0] and "no/such-model-here" in err[1]
    assert not ray.is_initialized()  # the bad model was caught before starting Ray


def test_cli_writes_result(tmp_path):
    out = tmp_path / "r.json"
    assert main(["--model", MODEL, "--n", "2", "--max-new-tokens", "4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["n"] == 2 and res["set"] == "arith-1" and "workers" not in res
