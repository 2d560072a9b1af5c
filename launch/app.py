"""The web app: train, watch, evaluate and try a model from a browser.

    pip install -e ".[app]"     # Gradio; `make app` does both
    python -m launch.app        # http://127.0.0.1:7860 (--host, --port, --runs)

Four tabs over `launch/webapp.py` and `launch/webapp_models.py` (the work; no Gradio there):
Train starts the real driver (`launch.train`, its own process: it keeps going when the page
closes), Watch plots a run's metrics.jsonl every few seconds, Evaluate scores models as
`launch.evaluate` does, Try completes one question with the verifier's verdict. Bad input
shows one line in the page; nothing starts.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # all traffic stays on this machine
import gradio as gr  # noqa: E402

from launch import webapp, webapp_models  # noqa: E402
from launch.evaluate import SET_NAMES  # noqa: E402
from launch.presets import PRESETS, get_preset  # noqa: E402

REFRESH_S = 3.0
"""Watch tab refresh period"""


def preset_values(name: str) -> list:
    """Train form values of a preset, in FORM order after the preset."""
    cfg = get_preset(name)
    return [cfg.model.name, cfg.rollout.engine, cfg.run.steps, cfg.rollout.group_size,
            cfg.grpo.lr, cfg.lora.r, cfg.curriculum.task, cfg.curriculum.level, cfg.run.seed]


def _form(values) -> dict:
    return dict(zip(webapp.FORM_FLAGS, values))


def build(runs_root: str = "runs") -> gr.Blocks:
    with gr.Blocks(title="homerl") as page:
        gr.Markdown("# homerl: GRPO on the machine you have")
        run_pick = _train_tab(runs_root)
        _watch_tab(runs_root, run_pick)
        _evaluate_tab(runs_root)
        _try_tab(runs_root)
    return page


def _train_tab(root: str):
    with gr.Tab("Train"):
        first = preset_values("tiny")
        with gr.Row():
            preset = gr.Dropdown(list(PRESETS), value="tiny", label="preset")
            model = gr.Textbox(first[0], label="model (embedded name, local path or hub id)")
            engine = gr.Dropdown(["hf", "vllm"], value=first[1], label="rollout engine")
        with gr.Row():
            steps = gr.Number(first[2], label="steps", precision=0)
            group = gr.Number(first[3], label="group size G", precision=0)
            lr = gr.Number(first[4], label="learning rate")
            rank = gr.Number(first[5], label="LoRA rank", precision=0)
        with gr.Row():
            task = gr.Dropdown(["arith", "gsm8k"], value=first[6], label="task")
            level = gr.Number(first[7], label="arithmetic level (1-3)", precision=0)
            seed = gr.Number(first[8], label="seed", precision=0)
        fields = [preset, model, engine, steps, group, lr, rank, task, level, seed]
        preset.change(preset_values, preset, fields[1:])
        with gr.Row():
            start = gr.Button("Start run", variant="primary", elem_id="start")
            stop = gr.Button("Stop (checkpoint, resumable)", elem_id="stop")
            resume = gr.Button("Resume", elem_id="resume")
        message = gr.Textbox(label="status", interactive=False, elem_id="train-status")
        run_pick = gr.Dropdown(webapp.list_runs(root), label="run", allow_custom_value=True,
                               elem_id="train-run")

        def on_start(*values):
            try:
                run_dir = webapp.start_run(_form(values), root)
            except webapp.FormError as e:
                return f"error: {e}", gr.update()
            return (f"started {run_dir}: open Watch to follow it",
                    gr.update(choices=webapp.list_runs(root), value=run_dir))

        def on_resume(run_dir):
            try:
                webapp.resume_run(run_dir or "")
            except webapp.FormError as e:
                return f"error: {e}"
            return f"resumed {run_dir}"

        start.click(on_start, fields, [message, run_pick])
        stop.click(lambda d: webapp.stop_run(d) if d else "pick a run", run_pick, message)
        resume.click(on_resume, run_pick, message)
    return run_pick


def _watch(run_dir: str | None):
    if not run_dir:
        return "pick a run", None, [], ""
    try:
        status = webapp.run_status(run_dir)
    except (OSError, ValueError, KeyError) as e:
        return f"error: {run_dir}: {e}", None, [], ""
    url = webapp.dashboard_url()
    dash = f"[Ray dashboard]({url})" if url else ("No Ray dashboard is up (local runs start Ray "
                                                  "without one; `ray start --head` starts one).")
    return (status.message, webapp.curve_figure(run_dir), webapp.latest_samples(run_dir), dash)


def _watch_tab(root: str, train_pick):
    with gr.Tab("Watch") as tab:
        with gr.Row():
            pick = gr.Dropdown(webapp.list_runs(root), label="run directory",
                               allow_custom_value=True, elem_id="watch-run")
            refresh = gr.Button("Refresh list")
        status = gr.Textbox(label="status", interactive=False, elem_id="watch-status")
        plot = gr.Plot(label="metrics", elem_id="watch-plot")
        samples = gr.Dataframe(headers=list(webapp.SAMPLE_COLUMNS), label="latest completions",
                               wrap=True, elem_id="watch-samples")
        dash = gr.Markdown()
        outputs = [status, plot, samples, dash]
        refresh.click(lambda: gr.update(choices=webapp.list_runs(root)), None, pick)
        tab.select(lambda d: gr.update(choices=webapp.list_runs(root), value=d), train_pick, pick)
        pick.change(_watch, pick, outputs)
        gr.Timer(REFRESH_S).tick(_watch, pick, outputs)


def _model_choices(root: str) -> list[str]:
    return ["smollm2-135m-instruct", "tiny-random-llama", *webapp.checkpoints(root)]


def _evaluate_tab(root: str):
    with gr.Tab("Evaluate") as tab:
        models = gr.Dropdown(_model_choices(root), multiselect=True, allow_custom_value=True,
                             label="models: base and checkpoints (a run's final/)",
                             elem_id="eval-models")
        with gr.Row():
            sets = gr.Dropdown(list(SET_NAMES), multiselect=True, value=["arith-1-unseen"],
                               label="built-in held-out sets", elem_id="eval-sets")
            n = gr.Number(50, label="problems per built-in set", precision=0)
            samples = gr.Number(0, label="samples for pass@k (0: greedy only)", precision=0)
        upload = gr.File(label="or your own JSONL (question, answer)", file_types=[".jsonl"],
                         type="filepath", elem_id="eval-upload")
        go = gr.Button("Evaluate", variant="primary", elem_id="eval-go")
        result = gr.Markdown(elem_id="eval-result")
        text = gr.Textbox(label="launch.evaluate's table", interactive=False, lines=4)
        download = gr.File(label="JSON", elem_id="eval-json")

        def on_eval(models, sets, n, samples, upload, progress=gr.Progress(track_tqdm=True)):  # noqa: B008
            try:
                md, txt, path = webapp_models.run_eval(models, sets, n, upload, samples)
            except webapp.FormError as e:
                return f"**error:** {e}", "", None
            return md, txt, path

        go.click(on_eval, [models, sets, n, samples, upload], [result, text, download])
        tab.select(lambda: gr.update(choices=_model_choices(root)), None, models)


def _try_tab(root: str):
    with gr.Tab("Try") as tab:
        model = gr.Dropdown(_model_choices(root), value="smollm2-135m-instruct",
                            allow_custom_value=True, label="model or checkpoint",
                            elem_id="try-model")
        prompt = gr.Textbox("What is 3 + 4?", label="question", lines=2, elem_id="try-prompt")
        with gr.Row():
            greedy = gr.Checkbox(True, label="greedy (off: sample at temperature 1)")
            expected = gr.Textbox("", label="expected answer (optional)", elem_id="try-expected")
        go = gr.Button("Generate", variant="primary", elem_id="try-go")
        completion = gr.Textbox(label="completion", interactive=False, lines=4,
                                elem_id="try-completion")
        verdict = gr.Textbox(label="verifier", interactive=False, elem_id="try-verdict")

        def on_try(model, prompt, greedy, expected):
            try:
                return webapp_models.try_model(model, prompt, greedy, expected)
            except webapp.FormError as e:
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="launch.app", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (loopback only "
                   "by default; 0.0.0.0 exposes the app, which can start runs, to the network)")
    p.add_argument("--port", type=int, default=7860, help="port to serve on")
    p.add_argument("--runs", default="runs", help="directory of run directories")
    args = p.parse_args(argv)
    if not port_free(args.host, args.port):
        print(f"launch.app: error: --port: {args.host}:{args.port} is taken; pick another "
              f"(e.g. --port {args.port + 1})", file=sys.stderr)
        return 2
    print(f"homerl app: http://{args.host}:{args.port}", flush=True)
    build(args.runs).queue().launch(server_name=args.host, server_port=args.port,
                                    show_error=True, quiet=True, ssr_mode=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
