"""tools.experiments.learning keeps the seeds an earlier run of the same arm finished."""

import json

from tools.experiments.learning import finished_runs


def _write(path, preset="cpu-demo", flags=("--rollout.engine", "vllm"), n=200, seeds=(0,),
           engine="vllm"):
    runs = [{"seed": s, "train_min": 9.5, "s_per_step": 5.0, "scores": {}} for s in seeds]
    base = {split: {"accuracy": 0.2, "n": n} for split in ("seen", "unseen")}
    with open(path, "w") as f:
        record = {"tag": "t", "preset": preset, "flags": list(flags), "base": base,
                  "runs": runs, "engine": engine}
        if engine is None:  # written before the engine was recorded: the HF engine's
            del record["engine"]
        json.dump(record, f)


def test_seeds_of_the_same_arm_are_kept_by_seed(tmp_path):
    path = tmp_path / "results.json"
    _write(path, seeds=(0, 2))
    done = finished_runs(str(path), "cpu-demo", ["--rollout.engine", "vllm"], 200, "vllm")
    assert sorted(done) == [0, 2] and done[2]["seed"] == 2


def test_another_preset_flags_or_eval_size_trains_again(tmp_path):
    path = tmp_path / "results.json"
    _write(path)
    flags = ["--rollout.engine", "vllm"]
    assert finished_runs(str(path), "tiny", flags, 200, "vllm") == {}
    assert finished_runs(str(path), "cpu-demo", ["--rollout.engine", "hf"], 200, "vllm") == {}
    assert finished_runs(str(path), "cpu-demo", flags, 100, "vllm") == {}
    assert finished_runs(str(tmp_path / "none.json"), "cpu-demo", flags, 200, "vllm") == {}
    path.write_text('{"tag": ')  # torn by a kill mid-write
    assert finished_runs(str(path), "cpu-demo", flags, 200, "vllm") == {}


def test_a_file_from_before_the_engine_was_recorded_is_the_hf_engines(tmp_path):
    """No flags, and the preset moved from HF to vLLM: the old runs are not mixed in."""
    path = tmp_path / "results.json"
    _write(path, flags=(), engine=None)
    assert finished_runs(str(path), "cpu-demo", [], 200, "vllm") == {}
    assert sorted(finished_runs(str(path), "cpu-demo", [], 200, "hf")) == [0]


def test_the_report_breaks_level_1_down_by_facts():
    """Held-out facts (never trained in any phrasing) get their own line per split: base, and
    the seeds' mean and range."""
    from tools.experiments.learning import facts_lines

    def cell(seen, unseen):
        return {"by_fact": {"seen": {"n": 160, "accuracy": seen},
                            "unseen": {"n": 40, "accuracy": unseen}}}

    base = {"unseen": cell(0.2, 0.1)}
    runs = [{"scores": {"unseen": cell(0.7, 0.5)}}, {"scores": {"unseen": cell(0.6, 0.3)}}]
    lines = facts_lines(base, runs)
    assert lines[1] == ("  unseen templates, unseen facts (n=40): base 10.0%  trained 40.0% "
                        "(range 30.0%-50.0%)")
    assert facts_lines({"seen": {}}, runs) == []


def test_a_file_scored_on_other_sets_trains_again(tmp_path):
    """Seeds scored without the `--also` sets cannot fill a table that has them."""
    path = tmp_path / "results.json"
    _write(path)
    flags = ["--rollout.engine", "vllm"]
    assert finished_runs(str(path), "cpu-demo", flags, 200, "vllm",
                         ("seen", "unseen", "arith-3")) == {}
    assert sorted(finished_runs(str(path), "cpu-demo", flags, 200, "vllm",
                                ("seen", "unseen"))) == [0]


def test_the_report_breaks_level_2_down_by_operation_and_carry():
    from tools.experiments.learning import facts_lines

    def cell(add, mul):
        return {"by_op": {"add": {"n": 75, "accuracy": add},
                          "multiply": {"n": 54, "accuracy": mul}},
                "by_carry": {"carry": {"n": 172, "accuracy": mul}}}

    base = {"seen": cell(0.2, 0.05)}
    runs = [{"scores": {"seen": cell(0.5, 0.1)}}, {"scores": {"seen": cell(0.3, 0.2)}}]
    lines = facts_lines(base, runs)
    assert lines == [
        "  seen add (n=75): base 20.0%  trained 40.0% (range 30.0%-50.0%)",
        "  seen multiply (n=54): base 5.0%  trained 15.0% (range 10.0%-20.0%)",
        "  seen carry (n=172): base 5.0%  trained 15.0% (range 10.0%-20.0%)"]


def test_the_base_model_is_scored_once_per_set(tmp_path, tiny_llama):
    """A second arm reuses the base's scores of the same questions, and scores a set that
    differs (here: fewer questions) anew; the figures are the real model's either way."""
    from tasks.registry import make_task
    from tools.experiments.learning import base_scores

    task = make_task("arith", 1)
    sets = {"seen": task.heldout(3, "seen"), "unseen": task.heldout(3, "unseen")}
    first = base_scores(str(tmp_path), tiny_llama, sets, 4)
    assert set(first) == {"seen", "unseen"} and first["seen"]["n"] == 3
    cache = json.loads((tmp_path / "base.json").read_text())
    assert len(cache) == 2
    for k in cache:  # a figure only the cache holds: the second call must read it
        cache[k]["n"] = 99
    (tmp_path / "base.json").write_text(json.dumps(cache))
    assert base_scores(str(tmp_path), tiny_llama, sets, 4)["unseen"]["n"] == 99
    again = base_scores(str(tmp_path), tiny_llama, {"seen": task.heldout(2, "seen")}, 4)
    assert again["seen"]["n"] == 2 and len(json.loads((tmp_path / "base.json").read_text())) == 3
