"""The web app in a real browser (headless Debian Chromium driven by Playwright): upload a
dataset and start a tiny run on it from Train, see its plots in Watch while it runs, evaluate
its adapter on an uploaded file in Evaluate, get a completion in Try. Screenshots of each tab
go to HOMERL_SCREENSHOTS (default: the test's tmp dir); `make test-ui` writes them to docs/.

Skipped, with the reason, when Chromium, Gradio or Playwright is missing; `make ui-deps`
installs them and CI sets HOMERL_REQUIRE_BROWSER=1 so that a missing browser fails there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import _free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = [what for what, ok in (
    ("Chromium (apt-get install chromium; `make ui-deps`)", CHROMIUM),
    ("gradio (pip install -e '.[app]')", importlib.util.find_spec("gradio")),
    ("playwright (pip install -e '.[ui-test]')", importlib.util.find_spec("playwright")),
) if not ok]
if MISSING and os.environ.get("HOMERL_REQUIRE_BROWSER") == "1":
    raise RuntimeError(f"HOMERL_REQUIRE_BROWSER=1 but missing: {', '.join(MISSING)}")
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"no {', '.join(MISSING)}")

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]  # this machine's network is closed: no calls out


@pytest.fixture
def app_url(tmp_path, own_ray, tiny_llama):
    """`python -m launch.app` on a free loopback port, runs under tmp_path/runs."""
    port = _free_port()
    log = open(tmp_path / "app.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "launch.app", "--port", str(port),
                             "--runs", str(tmp_path / "runs")], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() - t0 > 90:
                proc.kill()
                pytest.fail("the app did not serve within 90 s: "
                            + (tmp_path / "app.log").read_text())
            time.sleep(0.5)
    yield url
    # shown by pytest only when the test failed: what the app and its run's driver printed
    for path in [tmp_path / "app.log", *sorted((tmp_path / "runs").glob("*/app.log"))]:
        print(f"--- {path} (last 3000 chars) ---\n{path.read_text()[-3000:]}")
    for run in (tmp_path / "runs").glob("*/app.json"):  # no driver outlives the test
        pid = json.loads(run.read_text())["pid"]
        try:
            os.killpg(pid, 2)
        except ProcessLookupError:
            pass
    proc.terminate()
    proc.wait(30)
    log.close()


def _shots_dir(tmp_path) -> str:
    path = os.environ.get("HOMERL_SCREENSHOTS") or str(tmp_path / "shots")
    os.makedirs(path, exist_ok=True)
    return path


def _text(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} textarea, #{elem_id} input").first.input_value()


def _wait_text(page, elem_id: str, predicate, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = _text(page, elem_id)
        if predicate(value):
            return value
        page.wait_for_timeout(500)
    raise AssertionError(f"#{elem_id} after {timeout_s:.0f}s: {_text(page, elem_id)!r}")


def _tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def _pick(page, elem_id: str, value: str) -> None:
    """Type a value into a Gradio dropdown (custom values allowed) and confirm it."""
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill(value)
    box.press("Enter")
    page.keyboard.press("Escape")


def test_train_watch_evaluate_try_in_a_real_browser(app_url, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = _shots_dir(tmp_path)
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "answer": i + 2}) + "\n"
                            for i in range(4)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "What is 1 + 1?", "answer": 2}\n{"question": "And 2 + 2?"}\n')
    train = tmp_path / "my sums.jsonl"  # 100 held out by default, 20 to train on
    train.write_text("".join(json.dumps({"question": f"Add {i} and {i + 3}.", "answer": 2 * i + 3})
                             + "\n" for i in range(120)))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(app_url)

        # Train: a bad value shows one line and starts nothing; then a tiny run starts
        page.get_by_label("steps").fill("-2")
        page.locator("#start").click()
        err = _wait_text(page, "train-status", lambda v: v.startswith("error"), 30)
        assert "run.steps" in err and "\n" not in err
        page.get_by_label("steps").fill("30")
        model = page.get_by_label("model (an embedded name or a run's final/")
        model.fill("nobody-has/this-model-xyz")
        page.locator("#start").click()
        err = _wait_text(page, "train-status", lambda v: "nobody-has" in v, 30)
        assert err.startswith("error: model 'nobody-has/this-model-xyz'") and "\n" not in err
        model.fill("tiny-random-llama")
        assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")
        # the user's own dataset: uploaded into the app's uploads, picked as the file task
        _pick(page, "train-task", "file")
        page.locator("#train-upload input[type=file]").set_input_files(str(train))
        page.wait_for_function("() => document.querySelector('#train-data input').value"
                               ".includes('my_sums.jsonl')", timeout=30_000)
        page.locator("#start").click()
        started = _wait_text(page, "train-status", lambda v: v.startswith("started"), 30)
        run_dir = started.split()[1].rstrip(":")
        with open(os.path.join(run_dir, "config.json")) as f:
            cur = json.load(f)["curriculum"]
        assert cur["task"] == "file" and cur["data_path"].endswith("uploads/my_sums.jsonl")
        page.screenshot(path=os.path.join(shots, "train.png"), full_page=True)

        # Watch: the run's plots and completions appear while it runs
        _tab(page, "Watch")
        status = _wait_text(page, "watch-status",
                            lambda v: v.startswith("running") and "step 0 " not in v, 240)
        page.locator("#watch-plot img, #watch-plot canvas, #watch-plot svg").first.wait_for(
            timeout=30_000)
        assert "running" in status
        page.screenshot(path=os.path.join(shots, "watch.png"), full_page=True)

        # a malformed upload while the run goes on: one line, the app and the run live on
        _tab(page, "Evaluate")
        _pick(page, "eval-models", "tiny-random-llama")
        page.locator("#eval-upload input[type=file]").set_input_files(str(bad))
        page.locator("#eval-go").click()
        page.get_by_text("bad.jsonl:2: field 'answer'").wait_for(timeout=60_000)
        page.locator("#eval-upload button[aria-label='Clear']").first.click()
        _tab(page, "Watch")
        _wait_text(page, "watch-status", lambda v: v.startswith("finished"), 300)
        assert os.path.exists(os.path.join(run_dir, "final", "homerl.json"))

        # Evaluate: the run's adapter on an uploaded file, with the table and its JSON
        _tab(page, "Evaluate")
        page.locator("#eval-models [title='Clear']").first.click()
        _pick(page, "eval-models", os.path.join(run_dir, "final"))
        page.get_by_label("problems per built-in set").fill("5")
        page.locator("#eval-upload input[type=file]").set_input_files(str(data))
        page.locator("#eval-go").click()
        page.locator("#eval-result table").wait_for(timeout=180_000)
        table = page.locator("#eval-result table").inner_text()
        assert "mine" in table and "arith-1-unseen" in table
        page.screenshot(path=os.path.join(shots, "evaluate.png"), full_page=True)

        # Try: a completion from the checkpoint and the verifier's verdict
        _tab(page, "Try")
        _pick(page, "try-model", os.path.join(run_dir, "final"))
        page.locator("#try-expected input, #try-expected textarea").first.fill("7")
        page.locator("#try-go").click()
        verdict = _wait_text(page, "try-verdict", lambda v: bool(v), 120)
        assert verdict.split(":")[0] in ("correct", "wrong"), verdict
        page.screenshot(path=os.path.join(shots, "try.png"), full_page=True)
        browser.close()
