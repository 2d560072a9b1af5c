"""The web app against a hostile page (launch/app/): an upload never becomes a run, Resume
applies the same policy as Start, the login is taken from a file or the environment and is
rate-limited, uploads have a total cap and leave no temporary copy, `--max-runs` holds when
Start and Resume race, and only a live driver of the app (or the process holding a run's lock)
counts as running."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest
from conftest import _free_port, without_ray

from common.config import Config
from common.presets import get_preset
from launch.app import runs, uploads
from launch.app.policy import Policy, PolicyError
from launch.app.runs import FormError
from launch.rundir.ownership import LOCK
from launch.rundir.writer import RunWriter

AUTH_ENV = "HOMERL_APP_AUTH"


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def _write(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _forged_config(model: str, data: str) -> dict:
    cfg = get_preset("tiny").to_dict()
    cfg["model"]["name"] = model  # a path outside the app's folders
    cfg["curriculum"].update(task="file", data_path=data)  # a server file to show in Watch
    cfg["reward"].update(fn="nowhere_such_module:score", unsandboxed_code=True)
    return cfg


def test_an_uploaded_forged_run_is_neither_listed_nor_resumable(tmp_path, tiny_llama):
    root = tmp_path / "runs"
    policy = Policy(runs_root=str(root))
    secret = _write(tmp_path / "secret" / "keys.jsonl", '{"question": "k", "answer": 1}\n')
    forged = _forged_config(tiny_llama, secret)
    page = tmp_path / "page"  # what a page user uploads, under these very names
    kept = [uploads.keep_upload(_write(page / "config.json", json.dumps(forged)), policy),
            uploads.keep_upload(_write(page / "metrics.jsonl", '{"step": 0}\n'), policy)]
    names = {os.path.basename(k) for k in kept}
    assert not names & {"config.json", "metrics.jsonl"}, names  # the server names uploads
    assert uploads.upload_name(".homerl-run.json") == ("homerl-run", ".json")  # no dot-file
    assert runs.list_runs(str(root)) == []
    for folder in {os.path.dirname(k) for k in kept}:
        with pytest.raises(FormError) as err:
            runs.resume_run(folder, policy)
        assert "uploads" in _one_line(err)
    # the same files in the runs folder (the old uploads/ layout, or any directory a run did not
    # make): no marker, so not listed, not a model to pick, and not resumed
    legacy = root / "uploads"
    _write(legacy / "config.json", json.dumps(forged))
    _write(legacy / "metrics.jsonl", '{"step": 0}\n')
    old = time.time() - 600
    os.utime(legacy / "metrics.jsonl", (old, old))
    try:
        assert runs.list_runs(str(root)) == [] and runs.checkpoints(str(root)) == []
        with pytest.raises(FormError) as err:
            runs.resume_run(str(legacy), policy)
        assert "not a homerl run" in _one_line(err)
    finally:
        runs.kill_run(str(legacy))  # today's code spawned a driver here
    assert not (legacy / "app.json").exists()


def _marked_run(root, name: str = "20250101-000000-tiny") -> str:
    run_dir = str(root / name)
    RunWriter(run_dir, get_preset("tiny").to_dict())  # marker and config.json, as a start writes
    return run_dir


@pytest.mark.parametrize("field, value, named", [
    ("model.name", "MODEL", "model: "),
    ("curriculum.data_path", "DATA", "dataset: "),
    ("reward.fn", "mine.rewards:score", "reward functions: 'mine.rewards:score'"),
    ("reward.unsandboxed_code", True, "reward.unsandboxed_code"),
])
def test_resume_refuses_a_run_whose_config_breaks_the_policy(tmp_path, tiny_llama, field,
                                                            value, named):
    root = tmp_path / "runs"
    policy = Policy(runs_root=str(root))
    run_dir = _marked_run(root)
    cfg_path = os.path.join(run_dir, "config.json")
    cfg = json.loads(open(cfg_path).read())
    assert runs.allowed(Config.from_dict(cfg), str(root), policy)  # as started: allowed
    outside = _write(tmp_path / "outside.jsonl", '{"question": "q", "answer": 1}\n')
    section, key = field.split(".")
    cfg[section][key] = {"MODEL": tiny_llama, "DATA": outside}.get(value, value)
    if key == "data_path":
        cfg["curriculum"]["task"] = "file"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    try:
        with pytest.raises(FormError) as err:
            runs.resume_run(run_dir, policy)
        assert _one_line(err).startswith(named), err.value
    finally:
        runs.kill_run(run_dir)  # today's code resumed it
    assert not os.path.exists(os.path.join(run_dir, "app.json"))


def _impostor(*argv: str) -> subprocess.Popen:
    """A live process of ours whose command line names launch.train: not a run's driver."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv])


def test_only_a_live_driver_counts_as_running(tmp_path):
    root = tmp_path / "runs"
    fresh = _marked_run(root, "fresh-metrics")  # rows written just now, no process at all
    with open(os.path.join(fresh, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 0}) + "\n")
    claimed = _marked_run(root, "claimed")  # app.json naming a live process that is not its own
    other = _impostor("-m", "launch.train", "--run-dir", str(root / "elsewhere"))
    locked = _marked_run(root, "locked")  # a shell's run: the live process holding its lock
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from launch.rundir.ownership import lock_run; "
         "lock_run(sys.argv[1]); print('ok', flush=True); time.sleep(60)", locked],
        stdout=subprocess.PIPE, text=True)
    try:
        with open(os.path.join(claimed, "app.json"), "w") as f:
            json.dump({"pid": other.pid, "command": []}, f)
        assert holder.stdout.readline().strip() == "ok"
        assert runs.run_status(fresh).state == "stopped"
        assert runs.run_status(claimed).state == "failed"
        status = runs.run_status(locked)
        assert status.state == "running" and "outside the app" in status.message
        assert runs.running_count(str(root)) == 1
        # its lock file naming a process started after the lock was taken: a reused pid
        with open(os.path.join(locked, LOCK), "w") as f:
            json.dump({"pid": other.pid, "host": socket.gethostname(),
                       "since": "2000-01-01 00:00:00"}, f)
        assert runs.run_status(locked).state == "stopped"
        assert runs.running_count(str(root)) == 0
    finally:
        for proc in (other, holder):
            proc.kill()
            proc.wait()


def test_start_and_resume_racing_cannot_pass_max_runs(tmp_path, monkeypatch):
    """Three Starts and three Resumes at once under --max-runs 1: one driver starts, the others
    are refused in one line. (A dashboard address nobody listens on: each driver is `ray job
    submit`, alive for a second or two, and never trains.)"""
    monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{_free_port()}")
    root = tmp_path / "runs"
    policy = Policy(runs_root=str(root), max_runs=1)
    stopped = [_marked_run(root, f"stopped-{i}") for i in range(3)]
    calls = [lambda: runs.start_run({"preset": "tiny"}, str(root), policy) for _ in range(3)]
    calls += [lambda d=d: runs.resume_run(d, policy) for d in stopped]
    gate, results = threading.Barrier(len(calls)), []

    def go(action):
        gate.wait()
        try:
            results.append(action())
        except Exception as e:  # noqa: BLE001 (a refusal, or a crash the assert shows)
            results.append(e)

    threads = [threading.Thread(target=go, args=(c,)) for c in calls]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        started = [r for r in results if isinstance(r, str)]
        refused = [str(r) for r in results if isinstance(r, FormError)]
        assert len(started) == 1 and len(refused) == 5, results
        assert all("1 already running; at most 1 at once" in r for r in refused), refused
    finally:
        for run_dir in runs.list_runs(str(root)):
            runs.kill_run(run_dir, timeout_s=10)


def test_uploads_have_a_total_cap_and_leave_no_temporary_copy(tmp_path):
    policy = Policy(runs_root=str(tmp_path / "runs"), max_upload_mb=0.01, max_uploads_mb=0.025)
    assert Policy(max_upload_mb=20).uploads_quota_mb == 200  # by default 10 files' worth
    temp = tmp_path / "gradio"  # Gradio's cache: one folder per upload
    row = json.dumps({"question": "What is 1 + 1?", "answer": 2}) + "\n"
    files = [_write(temp / f"h{i}" / "part.jsonl", row * 200) for i in range(3)]  # ~9 KB each
    kept = [uploads.accept_upload(files[0], policy, str(temp)),
            uploads.accept_upload(files[1], policy, str(temp))]
    assert all(os.path.getsize(k) > 8000 for k in kept) and len(set(kept)) == 2
    with pytest.raises(PolicyError) as err:
        uploads.accept_upload(files[2], policy, str(temp))
    assert _one_line(err).startswith("uploads: ") and "--max-uploads-mb" in str(err.value)
    assert os.listdir(temp) == []  # kept or refused, Gradio's copy and its folder are gone
    assert sorted(os.listdir(policy.uploads_dir)) == sorted(os.path.basename(k) for k in kept)


def test_auth_on_the_command_line_is_refused_and_the_environment_works(capsys, monkeypatch):
    app = pytest.importorskip("launch.app.ui", reason="gradio not installed")
    with socket.socket() as taken:  # every main() below stops at the port, never serves
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert app.main(["--auth", "ann:correct-horse", "--port", port]) == 2
        err = without_ray(capsys.readouterr().err)
        assert err.startswith("launch.app: error: --auth:") and "\n" not in err
        assert "--auth-file" in err and AUTH_ENV in err
        monkeypatch.setenv(AUTH_ENV, "ann:correct-horse")
        assert app.main(["--host", "127.0.0.1", "--port", port]) == 2
        assert "is taken" in capsys.readouterr().err  # the login was accepted
        assert AUTH_ENV not in os.environ  # read, then kept from the drivers the app starts
        monkeypatch.setenv(AUTH_ENV, "ann:short")
        assert app.main(["--port", port]) == 2
        err = capsys.readouterr().err
        assert AUTH_ENV in err and "8 or more" in err


def test_failed_logins_lock_one_client_out_for_a_while():
    from launch.app import login

    guard = login.LoginGuard("ann", "correct-horse", max_failures=3, window_s=60,
                             lockout_s=0.5)
    assert guard("ann", "correct-horse")
    with login.client("10.0.0.9"):
        assert [guard("ann", f"guess-{i}") for i in range(3)] == [False] * 3
        assert not guard("ann", "correct-horse")  # locked out: even the password fails
    with login.client("10.0.0.7"):
        assert guard("ann", "correct-horse")  # another client is not
        assert not guard("bob", "correct-horse")
    time.sleep(0.6)
    with login.client("10.0.0.9"):
        assert guard("ann", "correct-horse")


def _post_login(port: int, password: str, source: str = "127.0.0.1") -> int:
    """POST /login from the loopback address `source`: the HTTP status."""
    body = urllib.parse.urlencode({"username": "ann", "password": password})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request("POST", "/login", body,
                     {"Content-Type": "application/x-www-form-urlencoded"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_served_app_takes_the_login_from_the_environment_and_limits_it(tmp_path):
    pytest.importorskip("gradio", reason="gradio not installed")
    port = _free_port()
    env = {**os.environ, AUTH_ENV: "ann:correct-horse"}
    with open(tmp_path / "app.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "launch.app", "--port", str(port),
                                 "--runs", str(tmp_path / "runs")], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:  # the login page, once the app serves
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    (tmp_path / "app.log").read_text())
                time.sleep(0.5)
        assert _post_login(port, "correct-horse") == 200
        assert [_post_login(port, "wrong-guess") for _ in range(5)] == [400] * 5
        assert _post_login(port, "correct-horse") == 400  # this client waits now
        assert _post_login(port, "correct-horse", source="127.0.0.2") == 200  # not another
    finally:
        proc.terminate()
        proc.wait(30)
