"""tools.compare.bench end to end on the tiny model: TRL's GRPOTrainer, then ours on a local Ray
cluster.

1 warm-up + 1 timed step, 8 new tokens; checks the printed format (the ratio line last) and the
--json figures, and the --rollout-only lines.
"""

import json
import re

import pytest
from conftest import without_ray

from tools.compare import bench

pytest.importorskip("trl")

SYSTEM = re.compile(r"run 1 (trl|ours): (\S+) s/step, (\S+) completions/s, (\S+) tokens/s, "
                    r"peak footprint (\S+) GB, peak RSS (\S+) GB")
TINY = ["--model", "tiny-random-llama", "--max-new-tokens", "8", "--engine", "hf",
        "--trl-engine", "hf"]


def report_lines(out: str) -> list[str]:
    """The report from its `machine:` line on (libraries may print notices before it, e.g.
    wandb's "Running in WANDB offline mode" when WANDB_MODE=offline)."""
    lines = out.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("machine: "))
    return [line for line in lines[start:] if not line.startswith("[INFO]")]



@pytest.mark.slow
def test_compare_prints_one_line_per_system_and_ratio_last(capsys, tmp_path):
    """TRL runs in this process; ours in a driver process of its own, with its own local Ray
    cluster (tools/compare/ours_driver.py)."""
    out = tmp_path / "bench.json"
    assert bench.main(TINY + ["--steps", "1", "--warmup", "1", "--runs", "1",
                              "--json", str(out)]) == 0
    lines = report_lines(capsys.readouterr().out)
    assert lines[0].startswith("machine: ") and "trl " in lines[0]
    assert lines[1].startswith("settings: ")
    assert "max_staleness=1, steps_per_call=1" in lines[1]  # the defaults users get, stated
    assert lines[2].startswith("trl configuration: TRL ") and "use_vllm=False" in lines[2]
    matches = [SYSTEM.fullmatch(line) for line in lines[3:5]]
    assert all(matches), lines
    assert [m.group(1) for m in matches] == ["trl", "ours"]
    for m in matches:
        assert all(float(v) > 0 for v in m.groups()[1:]), m.group(0)
    parts = [re.match(r"(trl|ours) step \(median s\): (.+)", line) for line in lines[5:7]]
    assert all(parts), lines
    assert "generation" in parts[0].group(2) and "scoring" in parts[1].group(2)
    memory = re.fullmatch(r"memory ours/TRL: (\S+) peak footprint \(summed PSS\), (\S+) peak "
                          r"RSS \(summed per process\)", lines[-3])
    assert memory, lines[-3]
    roles = re.match(r"ours at its peak footprint \(PSS, median of the runs\): driver (\S+) GB, "
                     r"learner (\S+) GB, workers (\S+) GB", lines[-2])
    assert roles, lines[-2]
    # ours' driver is a process of its own that imports no torch, as launch.train's: not this
    # process, which has imported TRL and torch and run TRL
    assert 0 < float(roles.group(1)) < min(0.3, float(roles.group(2)))
    fp = [float(m.group(5)) for m in matches]
    rss = [float(m.group(6)) for m in matches]
    assert float(memory.group(1)) == pytest.approx(fp[1] / fp[0], rel=0.02)
    assert float(memory.group(2)) == pytest.approx(rss[1] / rss[0], rel=0.02)
    last = re.fullmatch(r"ratio ours/TRL: (\S+) over 1 run\(s\): total completions / total "
                        r"timed wall time, per side", lines[-1])
    assert last, lines[-1]
    ratio = float(last.group(1))
    data = json.loads(out.read_text())
    assert data["ratio_ours_over_trl"] == pytest.approx(ratio, abs=0.01)
    trl_s, ours_s = (data["runs"][0][n]["step_s"][1:] for n in ("trl", "ours"))
    assert ratio == pytest.approx(sum(trl_s) / sum(ours_s), abs=0.01)  # totals, not pairs
    for name in ("trl", "ours"):
        r = data["runs"][0][name]
        assert len(r["step_s"]) == 2 and len(r["tokens"]) == 2  # warm-up + timed
        assert all(0 < t <= 16 * 8 for t in r["tokens"])
        assert len(r["parts"]) == 2


def test_bad_rollout_settings_are_a_one_line_error_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--steps-per-call", "3", "--max-staleness", "1"])
    assert e.value.code == 2
    err = without_ray(capsys.readouterr().err)
    assert "\n" not in err and "rollout.steps_per_call=3" in err and "max_staleness=1" in err


@pytest.mark.slow
def test_rollout_only_lines(ray_cluster, capsys):
    assert bench.main(TINY + ["--rollout-only", "--reps", "1", "--workers", "1,2"]) == 0
    lines = report_lines(capsys.readouterr().out)
    assert lines[0].startswith("machine: ") and lines[1].startswith("rollout: ")
    rates = [re.match(r"(.+): (\S+) tokens/s", line) for line in lines[2:]]
    assert len(rates) == 4 and all(rates), lines
    assert all(float(m.group(2)) > 0 for m in rates)
    assert "HFRolloutWorker" in lines[2] and "plain HF" in lines[3]
    assert "1 hf worker x" in lines[4] and "2 hf workers x" in lines[5]


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def test_release_memory_resets_the_high_water_mark_between_systems():
    """The second system's peak must not carry the first's: after a 400 MB buffer is freed,
    release_memory() brings VmHWM back to near VmRSS (without the reset it stays 400 MB up)."""
    from tools.compare.settings import release_memory

    buf = bytearray(400 * 2**20)
    buf[::4096] = b"x" * len(buf[::4096])  # touch every page: resident
    del buf
    release_memory()
    assert _status_kb("VmHWM") - _status_kb("VmRSS") < 100 * 1024


def test_trl_alone_is_timed_by_trls_own_runtime(capsys, tmp_path):
    """--trl-alone: TRL only, no callback of ours; the s/step line is TRL's train_runtime
    over every step, and --json keeps both figures."""
    out = tmp_path / "alone.json"
    assert bench.main(TINY + ["--steps", "1", "--warmup", "1", "--trl-alone",
                              "--json", str(out)]) == 0
    line = report_lines(capsys.readouterr().out)[-1]
    m = re.fullmatch(r"trl alone: (\S+) s/step, the mean over all 2 steps "
                     r"\(TRL's train_runtime (\S+) s\)", line)
    assert m, line
    data = json.loads(out.read_text())
    assert data["train_runtime_s"] > 0
    assert data["s_per_step_all"] == pytest.approx(data["train_runtime_s"] / 2)
    assert float(m.group(1)) == pytest.approx(data["s_per_step_all"], rel=0.01)
