"""The web app: train, watch, evaluate and try a model from a browser.

    pip install -e ".[app]"     # Gradio; `make app` does both
    python -m launch.app        # http://127.0.0.1:7860 (--host, --port, --runs)

Four tabs over `launch/py` and `launch/py` (the work; no Gradio there):
Train starts the real driver (`launch.train`, its own process: it keeps going when the page
closes), Watch plots a run's metrics.jsonl every few seconds, Evaluate scores models as
`launch.evaluate` does, Try completes one question with the verifier's verdict. Bad input
shows one line in the page; nothing starts. What a page may do is the server's policy
(`launch/app/policy.py`: loopback unless a login (--auth-file or HOMERL_APP_AUTH, rate-limited
by `launch/app/login.py`), the app's own folders unless --allow-any-path, listed reward
functions, capped inputs; docs/app.md).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # all traffic stays on this machine
import gradio as gr  # noqa: E402
from gradio.utils import get_upload_folder  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from common.config import VERIFIERS  # noqa: E402
from common.presets import PRESETS, get_preset  # noqa: E402
from launch.app.login import ClientOfLogin, LoginGuard  # noqa: E402
from launch.app.model_tabs import run_eval, try_model  # noqa: E402
from launch.app.policy import AUTH_ENV, Policy, PolicyError, is_loopback, read_auth  # noqa: E402
from launch.app.runs import (  # noqa: E402
    FORM_FLAGS,
    FormError,
    check_run,
    checkpoints,
    list_runs,
    resume_run,
    run_status,
    start_run,
    stop_run,
)
from launch.app.uploads import accept_upload, dataset_choices  # noqa: E402
from launch.app.views import (  # noqa: E402
    SAMPLE_COLUMNS,
    curve_figure,
    dashboard_url,
    latest_samples,
)
from launch.evaluate.sets import SET_NAMES  # noqa: E402

REFRESH_S = 3.0
"""Watch tab refresh period"""
CACHE_S = 86400
"""Gradio's temporary files (an Evaluate upload) are deleted after a day, checked hourly"""


def preset_values(name: str) -> list:
    """Train form values of a preset, in FORM order after the preset."""
    cfg = get_preset(name)
    c = cfg.curriculum
    return [cfg.model.name, cfg.rollout.engine, cfg.run.steps, cfg.rollout.group_size,
            cfg.grpo.lr, cfg.lora.r, c.task, c.level, cfg.run.seed, c.data_path, c.verifier,
            c.prompt_field, c.answer_field, cfg.reward.fns()]


def _form(values) -> dict:
    return dict(zip(FORM_FLAGS, values))


def build(policy: Policy | None = None) -> gr.Blocks:
    policy = policy or Policy()
    with gr.Blocks(title="homerl", delete_cache=(3600, CACHE_S)) as page:
        gr.Markdown("# homerl: GRPO on the machine you have")
        run_pick = _train_tab(policy)
        _watch_tab(policy, run_pick)
        _evaluate_tab(policy)
        _try_tab(policy)
    return page


def _dataset_row(policy: Policy, first: list) -> list:
    """The Train tab's own-dataset fields: file (listed or uploaded), verifier, columns,
    reward functions from the server's list."""
    with gr.Row():
        data = gr.Dropdown(dataset_choices(policy), value=first[9] or None,
                           allow_custom_value=policy.any_path, elem_id="train-data",
                           label="dataset (task file): JSONL, CSV, Parquet or a datasets folder")
        upload = gr.File(label=f"upload a dataset (at most {policy.max_upload_mb:g} MB)",
                         file_types=[".jsonl", ".json", ".csv", ".parquet"], type="filepath",
                         elem_id="train-upload")
    with gr.Row():
        verifier = gr.Dropdown(list(VERIFIERS), value=first[10], label="verifier")
        prompt_field = gr.Textbox(first[11], label="prompt column (auto: messages, prompt, "
                                  "question or problem)")
        answer_field = gr.Textbox(first[12], label="answer column")
        fns = gr.Dropdown([*VERIFIERS, *policy.reward_fns], value=first[13], multiselect=True,
                          label="reward functions (empty: the verifier and the format bonus)")

    def on_upload(path):
        if not path:
            return gr.update()
        try:
            kept = accept_upload(path, policy, get_upload_folder())
        except PolicyError as e:
            gr.Warning(str(e))
            return gr.update()
        return gr.update(choices=dataset_choices(policy), value=kept)

    upload.upload(on_upload, upload, data)
    return [data, verifier, prompt_field, answer_field, fns]


def _train_tab(policy: Policy):
    root = policy.runs_root
    with gr.Tab("Train"):
        first = preset_values("tiny")
        with gr.Row():
            preset = gr.Dropdown(list(PRESETS), value="tiny", label="preset")
            model = gr.Textbox(first[0], label="model (an embedded name or a run's final/; "
                               "other paths and hub ids with the server's --allow-any-path)")
            engine = gr.Dropdown(["hf", "vllm"], value=first[1], label="rollout engine")
        with gr.Row():
            steps = gr.Number(first[2], label="steps", precision=0)
            group = gr.Number(first[3], label="group size G", precision=0)
            lr = gr.Number(first[4], label="learning rate")
            rank = gr.Number(first[5], label="LoRA rank", precision=0)
        with gr.Row():
            task = gr.Dropdown(["arith", "gsm8k", "file"], value=first[6], label="task",
                               elem_id="train-task")
            level = gr.Number(first[7], label="arithmetic level (1-3)", precision=0)
            seed = gr.Number(first[8], label="seed", precision=0)
        fields = [preset, model, engine, steps, group, lr, rank, task, level, seed,
                  *_dataset_row(policy, first)]
        preset.change(preset_values, preset, fields[1:])
        with gr.Row():
            start = gr.Button("Start run", variant="primary", elem_id="start")
            stop = gr.Button("Stop (checkpoint, resumable)", elem_id="stop")
            resume = gr.Button("Resume", elem_id="resume")
        message = gr.Textbox(label="status", interactive=False, elem_id="train-status")
        run_pick = gr.Dropdown(list_runs(root), label="run", allow_custom_value=True,
                               elem_id="train-run")

        def on_start(*values):
            try:
                run_dir = start_run(_form(values), root, policy)
            except FormError as e:
                return f"error: {e}", gr.update()
            return (f"started {run_dir}: open Watch to follow it",
                    gr.update(choices=list_runs(root), value=run_dir))

        def on_resume(run_dir):
            try:
                resume_run(run_dir or "", policy)
            except FormError as e:
                return f"error: {e}"
            return f"resumed {run_dir}"

        start.click(on_start, fields, [message, run_pick])
        stop.click(lambda d: _stop(d, policy), run_pick, message)
        resume.click(on_resume, run_pick, message)
    return run_pick


def _stop(run_dir: str | None, policy: Policy) -> str:
    if not run_dir:
        return "pick a run"
    try:
        return stop_run(check_run(run_dir, policy))
    except FormError as e:
        return f"error: {e}"


def _watch(run_dir: str | None, policy: Policy):
    if not run_dir:
        return "pick a run", None, [], ""
    try:
        status = run_status(check_run(run_dir, policy))
    except FormError as e:
        return f"error: {e}", None, [], ""
    except (OSError, ValueError, KeyError) as e:
        return f"error: {run_dir}: {e}", None, [], ""
    url = dashboard_url()
    dash = f"[Ray dashboard]({url})" if url else ("No Ray dashboard is up (local runs start Ray "
                                                  "without one; `ray start --head` starts one).")
    return (status.message, curve_figure(run_dir), latest_samples(run_dir), dash)


def _watch_tab(policy: Policy, train_pick):
    root = policy.runs_root
    with gr.Tab("Watch") as tab:
        with gr.Row():
            pick = gr.Dropdown(list_runs(root), label="run directory",
                               allow_custom_value=True, elem_id="watch-run")
            refresh = gr.Button("Refresh list")
        status = gr.Textbox(label="status", interactive=False, elem_id="watch-status")
        plot = gr.Plot(label="metrics", elem_id="watch-plot")
        samples = gr.Dataframe(headers=list(SAMPLE_COLUMNS), label="latest completions",
                               wrap=True, elem_id="watch-samples")
        dash = gr.Markdown()
        outputs = [status, plot, samples, dash]
        refresh.click(lambda: gr.update(choices=list_runs(root)), None, pick)
        tab.select(lambda d: gr.update(choices=list_runs(root), value=d), train_pick, pick)
        pick.change(lambda d: _watch(d, policy), pick, outputs)
        gr.Timer(REFRESH_S).tick(lambda d: _watch(d, policy), pick, outputs)


def _model_choices(root: str) -> list[str]:
    return ["smollm2-135m-instruct", "tiny-random-llama", *checkpoints(root)]


def _evaluate_tab(policy: Policy):
    root = policy.runs_root
    with gr.Tab("Evaluate") as tab:
        models = gr.Dropdown(_model_choices(root), multiselect=True,
                             allow_custom_value=policy.any_path,
                             label="models: base and checkpoints (a run's final/)",
                             elem_id="eval-models")
        with gr.Row():
            sets = gr.Dropdown(list(SET_NAMES), multiselect=True, value=["arith-1-unseen"],
                               label="built-in held-out sets", elem_id="eval-sets")
            n = gr.Number(50, label=f"problems per built-in set (at most {policy.max_eval_n})",
                          precision=0)
            samples = gr.Number(0, label=f"samples for pass@k (0: greedy only; at most "
                                f"{policy.max_samples})", precision=0)
        upload = gr.File(label=f"or your own JSONL (question, answer; at most "
                         f"{policy.max_upload_mb:g} MB)", file_types=[".jsonl"],
                         type="filepath", elem_id="eval-upload")
        go = gr.Button("Evaluate", variant="primary", elem_id="eval-go")
        result = gr.Markdown(elem_id="eval-result")
        text = gr.Textbox(label="launch.evaluate's table", interactive=False, lines=4)
        download = gr.File(label="JSON", elem_id="eval-json")

        def on_eval(models, sets, n, samples, upload, progress=gr.Progress(track_tqdm=True)):  # noqa: B008
            try:
                md, txt, path = run_eval(
                    models, sets, n, upload, samples,
                    out_dir=os.path.join(root, "evals"), policy=policy)
            except FormError as e:
                return f"**error:** {e}", "", None
            return md, txt, path

        go.click(on_eval, [models, sets, n, samples, upload], [result, text, download])
        tab.select(lambda: gr.update(choices=_model_choices(root)), None, models)


def _try_tab(policy: Policy):
    root = policy.runs_root
    with gr.Tab("Try") as tab:
        model = gr.Dropdown(_model_choices(root), value="smollm2-135m-instruct",
                            allow_custom_value=policy.any_path, label="model or checkpoint",
                            elem_id="try-model")
        prompt = gr.Textbox("What is 3 + 4?", label=f"question (at most "
                            f"{policy.max_prompt_chars} characters)", lines=2,
                            elem_id="try-prompt", max_length=policy.max_prompt_chars)
        with gr.Row():
            greedy = gr.Checkbox(True, label="greedy (off: sample at temperature 1)")
            expected = gr.Textbox("", label="expected answer (optional)", elem_id="try-expected")
        go = gr.Button("Generate", variant="primary", elem_id="try-go")
        completion = gr.Textbox(label="completion", interactive=False, lines=4,
                                elem_id="try-completion")
        verdict = gr.Textbox(label="verifier", interactive=False, elem_id="try-verdict")

        def on_try(model, prompt, greedy, expected):
            try:
                return try_model(model, prompt, greedy, expected, policy=policy)
            except FormError as e:
                return "", f"error: {e}"

        go.click(on_try, [model, prompt, greedy, expected], [completion, verdict])
        tab.select(lambda m: gr.update(choices=_model_choices(root), value=m), model, model)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch.app", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (loopback by "
                   "default; another address needs a login: the app starts processes)")
    p.add_argument("--port", type=int, default=7860, help="port to serve on")
    p.add_argument("--runs", default="runs", help="the app's runs folder (run directories, "
                   "checkpoints, uploads)")
    p.add_argument("--auth", default="", help=f"refused: a command line is visible to every "
                   f"local user (ps); use --auth-file or {AUTH_ENV}")
    p.add_argument("--auth-file", default="", help="a file whose first line is user:password "
                   f"(the login the page asks for; or the environment's {AUTH_ENV})")
    p.add_argument("--data-dir", default="", help="a folder of datasets the Train tab lists")
    p.add_argument("--reward-fn", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a reward function the page may pick (repeat; code run on this server)")
    p.add_argument("--allow-any-path", action="store_true",
                   help="let the page name any model (hub ids too), dataset or run directory")
    p.add_argument("--max-upload-mb", type=float, default=20.0, help="largest upload, MB")
    p.add_argument("--max-uploads-mb", type=float, default=0.0,
                   help="the kept uploads' total, MB (0: 10 x --max-upload-mb)")
    p.add_argument("--max-runs", type=int, default=1, help="training runs going at once")
    return p


def _login(args) -> tuple[str, str] | None:
    """The login from --auth-file or HOMERL_APP_AUTH (then removed from this process's
    environment, which the drivers it starts inherit). Raises PolicyError."""
    if args.auth:
        raise PolicyError(f"--auth: a password on the command line is visible to every local "
                          f"user (ps); give it in a file (--auth-file FILE, first line "
                          f"user:password) or the environment ({AUTH_ENV}=user:password)")
    return read_auth(args.auth_file, os.environ.pop(AUTH_ENV, ""))


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        auth = _login(args)
    except PolicyError as e:
        print(f"launch.app: error: {e}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and auth is None:
        print(f"launch.app: error: --host {args.host}: serving beyond this machine needs a "
              f"login (--auth-file FILE or {AUTH_ENV}=user:password): the app starts processes "
              "and reads files as the user who runs it", file=sys.stderr)
        return 2
    if not port_free(args.host, args.port):
        print(f"launch.app: error: --port: {args.host}:{args.port} is taken; pick another "
              f"(e.g. --port {args.port + 1})", file=sys.stderr)
        return 2
    policy = Policy(runs_root=args.runs, data_dir=args.data_dir, any_path=args.allow_any_path,
                    reward_fns=tuple(args.reward_fn), max_upload_mb=args.max_upload_mb,
                    max_uploads_mb=args.max_uploads_mb, max_runs=args.max_runs)
    print(f"homerl app: http://{args.host}:{args.port}", flush=True)
    build(policy).queue().launch(
        server_name=args.host, server_port=args.port, auth=auth and LoginGuard(*auth),
        app_kwargs={"middleware": [Middleware(ClientOfLogin)]},
        max_file_size=f"{args.max_upload_mb:g}mb", show_error=True, quiet=True, ssr_mode=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
