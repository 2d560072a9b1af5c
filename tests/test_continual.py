"""Continual-learning pieces: the anchor-KL term on hand-built tensors and in the learner, the
CL summary arithmetic (ACC, BWT, FWT) on a hand-made accuracy matrix."""

import json
import math

import numpy as np
import pytest
import torch
from test_learner import make_batch, tiny_cfg

from common.types import TrainBatch
from learner import losses
from learner.learner import Learner
from tools.experiments.cl_metrics import summarize


def test_anchor_kl_is_the_weighted_k3_and_ignores_unselected_garbage():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]])).requires_grad_()     # (1, 3)
    anchor = torch.log(torch.tensor([[0.25, 0.5, 0.3]]))
    anchor[0, 2] = float("nan")  # unselected: may hold anything
    w = torch.tensor([[0.5, 0.5, 0.0]])
    kl = losses.anchor_kl(logp, anchor, w)
    # d = anchor - logp: log 0.5 and log 2; k3 = e^d - d - 1
    want = 0.5 * (0.5 - math.log(0.5) - 1) + 0.5 * (2 - math.log(2) - 1)
    assert float(kl.detach()) == pytest.approx(want, rel=1e-6)
    kl.backward()
    # d k3 / d logp = 1 - e^d, times the weight; zero where unselected
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5 * (1 - 0.5), 0.5 * (1 - 2), 0.0]]))
    same = losses.anchor_kl(logp.detach(), logp.detach(), w)
    assert float(same) == 0.0


def _zero_adv(batch: TrainBatch) -> TrainBatch:
    return TrainBatch(batch.prompt_ids, batch.completion_ids, batch.old_logp, batch.entropy,
                      np.zeros(len(batch.advantages), np.float32))


def test_anchor_kl_pulls_the_policy_back_to_the_previous_stage():
    cfg = tiny_cfg("lora", lr=1e-2)
    cfg.ewc.anchor_kl = 1.0  # and ewc.lam = 0: anchor-KL alone
    learner = Learner(cfg)
    learner.train_on(make_batch(seed=0))  # off the init, where LoRA B = 0
    learner.consolidate([make_batch(seed=1)])
    assert learner.fisher == {} and set(learner.anchor) == set(learner.trainable)
    first = learner.train_on(make_batch(seed=2)).row()
    assert first["loss/anchor_kl"] == 0.0  # measured before the update, at the anchor
    for seed in range(3, 6):  # the next stage moves the policy away
        learner.train_on(make_batch(seed=seed))
    learner.opt = torch.optim.AdamW(learner.params.values(), lr=1e-3)  # no old momentum
    kls = [learner.train_on(_zero_adv(make_batch(seed=9))).row()["loss/anchor_kl"]
           for _ in range(5)]
    # no advantage left: the KL alone trains, and it takes the policy back toward the anchor
    # (a wrong sign would raise it; an anchor forward that kept the current weights gives 0)
    assert kls[0] > 0 and min(kls[1:]) < 0.5 * kls[0]


def test_anchor_kl_off_leaves_zero_advantage_steps_untrained():
    learner = Learner(tiny_cfg("lora", lr=1e-2))  # ewc.anchor_kl = 0
    learner.train_on(make_batch(seed=0))
    learner.consolidate([make_batch(seed=1)])
    learner.train_on(make_batch(seed=2))
    # no old momentum (a step without gradient still takes AdamW's): any move is a gradient's
    learner.opt = torch.optim.AdamW(learner.params.values(), lr=1e-3, weight_decay=0.0)
    before = {n: p.detach().clone() for n, p in learner.params.items()}
    row = learner.train_on(_zero_adv(make_batch(seed=9))).row()
    assert row["loss/anchor_kl"] == 0.0 and row["tokens/active_seqs"] == 0
    assert all(torch.equal(p, before[n]) for n, p in learner.params.items())


def test_anchor_without_fisher_survives_a_checkpoint(tmp_path):
    cfg = tiny_cfg("lora")
    cfg.ewc.anchor_kl = 1.0
    learner = Learner(cfg)
    learner.train_on(make_batch(seed=0))
    learner.consolidate([make_batch(seed=1)])
    learner.save(str(tmp_path))
    other = Learner(cfg)
    other.load(str(tmp_path))
    assert other.fisher == {} and set(other.anchor) == set(learner.anchor)
    for n, a in learner.anchor.items():
        assert torch.equal(other.anchor[n], a)


def test_cl_summary_on_a_hand_made_matrix():
    base = [0.2, 0.1, 0.0]
    R = [[0.8, 0.3, 0.1],    # after stage 1
         [0.6, 0.7, 0.2],    # after stage 2
         [0.5, 0.6, 0.9]]    # after stage 3
    s = summarize(R, base)
    assert s.acc == pytest.approx((0.5 + 0.6 + 0.9) / 3)
    assert s.bwt == pytest.approx(((0.5 - 0.8) + (0.6 - 0.7)) / 2)  # -0.2: forgetting
    assert s.fwt == pytest.approx(((0.3 - 0.1) + (0.2 - 0.0)) / 2)
    assert s.forgot_first == pytest.approx(0.3)
    assert s.kept == pytest.approx((0.5 - 0.2) / (0.8 - 0.2))
    assert math.isnan(summarize([[0.2, 0], [0.1, 0.5]], [0.2, 0]).kept)  # nothing gained
    with pytest.raises(ValueError, match="T x T"):
        summarize([[0.1, 0.2]], [0.1])


def test_forgetting_table_reads_the_matrices_it_is_given():
    """tools.experiments.forgetting's table: stage-1 loss, BWT and the kept share, per method,
    mean and range over seeds, from hand-made scores (tagged accuracy after each stage; plain
    accuracy held at 0.9 to show the table reads the metric it is asked for)."""
    from tools.experiments.forgetting import METRICS, SETS, matrix, table
    METRIC = METRICS[0]

    def run(rows, wall_s=600.0, peak=3.0):
        return {"after": [{s: {METRIC: x, "accuracy": 0.9} for s, x in zip(SETS, row)}
                          for row in rows],
                "wall_s": wall_s, "peak_pss_gb": peak}

    base = {s: {METRIC: 0.1, "accuracy": 0.9} for s in SETS}
    naive = [run([[0.6, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.8]]),
             run([[0.8, 0.1, 0.1], [0.4, 0.7, 0.1], [0.1, 0.2, 0.8]])]
    assert matrix(naive[0], METRIC)[1] == [0.2, 0.7, 0.1]
    assert "| naive | 2 | 90.0 (90.0 to 90.0) |" in table(base, {"naive": naive}, "accuracy")
    lines = table(base, {"naive": naive}, METRIC).splitlines()
    assert lines[2].startswith("| base | - | 10.0 | 10.0 | 10.0 |")
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[:5] == ["naive", "2", "10.0 (10.0 to 10.0)", "20.0 (20.0 to 20.0)",
                         "80.0 (80.0 to 80.0)"]
    # stage 1 lost 0.5 and 0.7; BWT = mean(0.1-0.6, 0.2-0.7) = -0.5 and mean(-0.7, -0.5) = -0.6
    assert cells[6] == "-55.0 (-60.0 to -50.0)" and cells[8] == "60.0 (50.0 to 70.0)"
    assert cells[9] == "0% (0% to 0%)"  # back at base: none of the gain kept
    assert cells[10:] == ["10.0 (10.0 to 10.0)", "3.00 (3.00 to 3.00)"]


def test_forgetting_resume_keeps_only_runs_of_the_same_design(tmp_path):
    """--resume reuses a saved (method, seed) run only when stages, steps, sets, preset and
    train flags all match; another design, a missing or a torn results.json reuse nothing."""
    from tools.experiments.forgetting import finished_runs, parse_args, same_design

    args = parse_args(["--seeds", "0", "--stage-steps", "5", "--n", "10", "--resume"])
    design = same_design(args)
    path = tmp_path / "results.json"
    runs = {"naive": [{"seed": 0, "after": [], "wall_s": 1.0, "peak_pss_gb": 1.0}]}
    path.write_text(json.dumps({"design": design, "results": runs}))
    assert finished_runs(str(path), design) == runs
    other = same_design(parse_args(["--stage-steps", "6", "--n", "10"]))
    assert finished_runs(str(path), other) == {}
    flags = same_design(parse_args(["--stage-steps", "5", "--n", "10", "--", "--lr", "1e-4"]))
    assert flags["train_flags"] == ["--lr", "1e-4"] and finished_runs(str(path), flags) == {}
    path.write_text('{"design": ')  # torn by a kill mid-write
    assert finished_runs(str(path), design) == {}
    assert finished_runs(str(tmp_path / "none.json"), design) == {}


def test_forgetting_resume_over_a_subset_keeps_the_other_saved_runs():
    """results.json after a --resume over some methods and seeds still holds every saved run of
    the design: a new run of a (method, seed) replaces the saved one, the others stay."""
    from tools.experiments.forgetting import kept_with

    def run(seed, wall):
        return {"seed": seed, "after": [], "wall_s": wall, "peak_pss_gb": 1.0}

    done = {"naive": [run(0, 1.0), run(1, 2.0), run(2, 3.0)], "replay": [run(1, 4.0)]}
    new = {"naive": [run(0, 1.0)], "ewc-1e3": [run(0, 9.0)], "replay": [run(1, 5.0)]}
    out = kept_with(new, done)
    assert [r["seed"] for r in out["naive"]] == [0, 1, 2]
    assert [r["wall_s"] for r in out["naive"]] == [1.0, 2.0, 3.0]
    assert out["replay"] == [run(1, 5.0)]  # the new run, not the saved one
    assert out["ewc-1e3"] == [run(0, 9.0)] and set(out) == {"naive", "replay", "ewc-1e3"}
    assert kept_with(new, {}) == new


def test_forgetting_arms_replay_only_where_named():
    """Replay is the curriculum's default, so every other arm turns it off: naive, anchor-KL and
    each EWC arm train without it; the replay arms with 0.25."""
    from tools.experiments.forgetting import method_config, parse_args

    args = parse_args(["--seeds", "0", "--ewc-lams", "1e3", "--stage-steps", "2", "--methods",
                       "naive,replay,anchor-kl,replay+anchor-kl"])
    assert list(parse_args([]).method_flags) == ["naive", "replay"]  # the default arms
    cfgs = {m: method_config(args, flags, 0) for m, flags in args.method_flags.items()}
    assert {m: c.curriculum.replay for m, c in cfgs.items()} == {
        "naive": 0.0, "replay": 0.25, "anchor-kl": 0.0, "replay+anchor-kl": 0.25,
        "ewc-1e3": 0.0}
    assert cfgs["ewc-1e3"].ewc.lam == 1e3 and cfgs["naive"].ewc.lam == 0.0
    assert cfgs["anchor-kl"].ewc.anchor_kl == 0.1 and cfgs["naive"].ewc.anchor_kl == 0.0


def test_forgetting_table_only_tables_the_saved_runs_without_training(tmp_path):
    """--table-only writes table.md and stages.png from results.json: the saved runs of the
    asked methods and seeds (here 2 of naive, 1 of an EWC arm; not the unasked replay); another
    design or no saved run of the asked methods is a one-line error."""
    from tools.experiments.forgetting import METRICS, SETS, main, parse_args, same_design

    def run(seed, last):
        rows = [[0.6, 0.1, 0.1], [0.3, 0.7, 0.1], [last, 0.2, 0.8]]
        return {"seed": seed, "wall_s": 60.0, "peak_pss_gb": 2.0,
                "after": [{s: {m: x for m in METRICS} for s, x in zip(SETS, row)}
                          for row in rows]}

    flags = ["--out", str(tmp_path), "--stage-steps", "5", "--n", "10"]
    saved = {"design": same_design(parse_args(flags)),
             "base": {s: {m: 0.1 for m in METRICS} for s in SETS},
             "results": {"naive": [run(0, 0.1), run(1, 0.3)], "ewc-1e3": [run(0, 0.5)],
                         "replay": [run(0, 0.6)]}}
    (tmp_path / "results.json").write_text(json.dumps(saved))
    assert main([*flags, "--methods", "naive", "--ewc-lams", "1e3", "--table-only"]) == 0
    md = (tmp_path / "table.md").read_text()
    assert "| naive | 2 | 20.0 (10.0 to 30.0) |" in md and "| ewc-1e3 | 1 | 50.0 " in md
    assert "| replay |" not in md and (tmp_path / "stages.png").stat().st_size > 0
    assert main([*flags, "--methods", "naive", "--seeds", "1", "--table-only"]) == 0
    assert "| naive | 1 | 30.0 |" in (tmp_path / "table.md").read_text()
    for argv, msg in [(["--stage-steps", "6"], "another design"),
                      (["--methods", "anchor-kl"], "no runs of anchor-kl"),
                      (["--out", str(tmp_path / "none")], "no readable")]:
        with pytest.raises(SystemExit, match=msg):
            main([*flags, *argv, "--table-only"])


def test_forgetting_starts_a_run_that_is_not_kept_in_an_empty_directory(tmp_path):
    from tools.experiments.forgetting import fresh_dir

    old = tmp_path / "naive" / "seed0"
    old.mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 0}\n')  # an interrupted run's rows
    assert fresh_dir(str(old)) == str(old) and not old.exists()


def test_forgetting_styles_order_the_stages_and_their_sets(capsys):
    """--styles puts the stages (and the held-out set each is scored on) in the given order;
    the order is part of the design --resume compares; an unknown or repeated style is a
    one-line error naming the allowed ones."""
    from tools.experiments.forgetting import method_config, parse_args, same_design

    args = parse_args(["--styles", "hash,boxed,answer", "--stage-steps", "4", "--seeds", "0"])
    assert args.sets == ("arith-1-hash", "arith-1-boxed", "arith-1")
    cfg = method_config(args, [], 0)
    assert cfg.curriculum.stages == "arith:1:4:hash,arith:1:4:boxed,arith:1:4"
    assert cfg.run.steps == 12
    two = parse_args(["--styles", "boxed,answer", "--stage-steps", "4"])
    assert method_config(two, [], 0).run.steps == 8
    assert same_design(args) != same_design(parse_args(["--stage-steps", "4"]))
    for bad in ("hash,nope", "hash,hash", "hash"):
        with pytest.raises(SystemExit):
            parse_args(["--styles", bad])
        assert "--styles" in capsys.readouterr().err


def test_forgetting_arms_branch_from_one_shared_stage_1(ray_cluster, tmp_path):
    """Real runs (tiny preset, local Ray): a seed's first arm trains stage 1 and checkpoints its
    end; the second branches from it (same stage-1 rows and scores, its own replay from stage 2
    on) and drops the stem's rollout in flight, so its first stage-2 rollout comes from the
    stage-1 weights (version 2), not the version before (1) as in the stem. --resume adds an
    arm that branches from the kept stem; --separate-stage1 is another design."""
    from tools.experiments.forgetting import main, parse_args, same_design

    flags = ["--preset", "tiny", "--stage-steps", "2", "--n", "4", "--seeds", "0",
             "--out", str(tmp_path)]
    assert main(flags) == 0
    runs = {m: rs[0] for m, rs in
            json.loads((tmp_path / "results.json").read_text())["results"].items()}
    naive, replay = runs["naive"], runs["replay"]
    assert (naive["stage1_from"], replay["stage1_from"]) == (None, "naive")
    assert replay["after"][0] == naive["after"][0] and len(replay["after"]) == 3
    assert replay["wall_s"] > replay["stage1_s"] == naive["stage1_s"] > 0

    def rows(method):
        path = tmp_path / method / "seed0" / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    n, r = rows("naive"), rows("replay")
    assert [x["step"] for x in r] == list(range(6))
    assert r[:2] == n[:2]  # stage 1: the stem's rows
    assert (n[2]["rollout/version"], r[2]["rollout/version"]) == (1, 2)
    cfg = json.loads((tmp_path / "replay" / "seed0" / "config.json").read_text())
    assert cfg["curriculum"]["replay"] == 0.25
    assert main([*flags, "--ewc-lams", "1e2", "--resume"]) == 0
    runs = json.loads((tmp_path / "results.json").read_text())["results"]
    assert runs["naive"][0] == naive and runs["replay"][0] == replay  # kept, not retrained
    assert runs["ewc-1e2"][0]["stage1_from"] == "naive"
    assert runs["ewc-1e2"][0]["after"][0] == naive["after"][0]
    separate = parse_args([*flags, "--separate-stage1"])
    assert not separate.share_stage1 and same_design(separate) != same_design(parse_args(flags))
