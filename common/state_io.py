"""Plain-state checkpoint files: tensors in safetensors, everything else in JSON. No pickle.

    save_state(dir, name, tensors, meta)   ->  dir/name.safetensors + dir/name.json
    load_state(dir, name)                  ->  (tensors, meta), validated

Opening a checkpoint runs no code, and a refactor cannot break it: what is stored is plain
arrays and JSON values. A missing, damaged or foreign file is a one-line `CheckpointError`
naming the file. Helpers turn the project's state into that form: ragged rows (token ids,
log-probs), RNG states, optimizer state, rollout and train batches.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import fields

import numpy as np

from common.durable import cut, fsync_file, os_error
from common.types import RolloutBatch, TrainBatch

FORMAT = "homerl-state/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message is one line naming the file."""


def save_state(directory: str, name: str, tensors: dict, meta: dict) -> None:
    """Write `name.safetensors` (tensors: name -> torch tensor or numpy array) and `name.json`.

    All-numpy states (the driver's) are written without importing torch; the file is the same.
    Both files are fsync'ed. A failed write is an OSError naming the file, with its errno
    (ENOSPC, EDQUOT: a full disk) even where safetensors wraps it in its own error type.
    """
    path = os.path.join(directory, f"{name}.safetensors")
    if all(isinstance(v, np.ndarray) for v in tensors.values()):
        from safetensors.numpy import save_file

        data = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    else:
        import torch
        from safetensors.torch import save_file

        data = {k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v)))
                .detach().cpu().contiguous() for k, v in tensors.items()}  # a writable copy
    try:
        save_file(data, path)
    except Exception as err:  # safetensors wraps a failed write (full disk) in its own error
        failure = os_error(err, path)  # the OSError with its errno (ENOSPC, EDQUOT, ...)
        if failure is None:
            raise
        raise failure from None
    cut("write", path)
    fsync_file(path)  # on disk before anything names it complete (a power cut empties it)
    meta_path = os.path.join(directory, f"{name}.json")
    with open(meta_path, "w") as f:
        json.dump({"format": FORMAT, "tensors": sorted(data), "meta": meta}, f)
        f.flush()
        cut("write", meta_path)
        os.fsync(f.fileno())
    cut("fsync", meta_path)


def check_state(directory: str, name: str) -> dict:
    """Validate `name.json` and the safetensors header (not the tensors' bytes) without loading
    anything big; returns the meta. A CheckpointError (one line) for anything unreadable."""
    from safetensors import safe_open

    head = _read_head(directory, name)
    path = os.path.join(directory, f"{name}.safetensors")
    try:
        with safe_open(path, "np") as f:
            keys = set(f.keys())
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
        raise CheckpointError(f"{path}: damaged or missing ({type(e).__name__})") from None
    _check_keys(path, head, keys)
    size = os.path.getsize(path)
    with open(path, "rb") as f:  # header length, then the header; data must follow in full
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
              default=0)
    if 8 + n + end > size:
        raise CheckpointError(f"{path}: damaged or missing (truncated: {size} of "
                              f"{8 + n + end} bytes)")
    return head.get("meta", {})


def load_state(directory: str, name: str, numpy: bool = False) -> tuple[dict, dict]:
    """(tensors, meta) of `save_state`, torch tensors (numpy arrays with `numpy`, which
    imports no torch); a CheckpointError for anything else."""
    if numpy:
        from safetensors.numpy import load_file
    else:
        from safetensors.torch import load_file

    head = _read_head(directory, name)
    path = os.path.join(directory, f"{name}.safetensors")
    try:
        tensors = load_file(path)
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
        raise CheckpointError(f"{path}: damaged or missing ({type(e).__name__})") from None
    _check_keys(path, head, set(tensors))
    return tensors, head.get("meta", {})


def _read_head(directory: str, name: str) -> dict:
    path = os.path.join(directory, f"{name}.json")
    if not os.path.exists(path):
        old = [f for f in ("driver.pkl", "learner.pt") if os.path.exists(
            os.path.join(directory, f))]
        why = (f"written by an older homerl ({old[0]}, a pickle), which cannot be resumed; "
               "start a new run") if old else "not a homerl checkpoint"
        raise CheckpointError(f"{directory}: no {name}.json: {why}")
    try:
        with open(path) as f:
            head = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: damaged ({type(e).__name__}: {e})") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        found = head.get("format") if isinstance(head, dict) else type(head).__name__
        raise CheckpointError(f"{path}: format {found!r}, this homerl reads {FORMAT!r}")
    return head


def _check_keys(path: str, head: dict, keys: set[str]) -> None:
    missing = sorted(set(head.get("tensors", [])) - keys)
    if missing:
        raise CheckpointError(f"{path}: lacks {len(missing)} tensors, e.g. {missing[0]}")


# ---- ragged rows ---------------------------------------------------------------------------
def pack_rows(prefix: str, rows: list, dtype) -> dict[str, np.ndarray]:
    """Ragged rows -> {prefix: concatenated values, prefix.len: row lengths}."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    flat = (np.concatenate([np.asarray(r, dtype=dtype) for r in rows]) if len(rows)
            else np.zeros(0, dtype=dtype))
    return {prefix: flat.astype(dtype), f"{prefix}.len": lengths}


def unpack_rows(tensors: dict, prefix: str) -> list[np.ndarray]:
    flat = np.asarray(tensors[prefix])
    bounds = np.concatenate([[0], np.cumsum(np.asarray(tensors[f"{prefix}.len"]))])
    return [flat[a:b].copy() for a, b in zip(bounds[:-1], bounds[1:])]


# ---- RNG and optimizer -----------------------------------------------------------------------
def rng_state() -> tuple[dict, dict]:
    """(tensors, meta) of the torch, numpy and Python RNG states of this process."""
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return ({"rng.torch": torch.get_rng_state(), "rng.numpy": np.asarray(keys, dtype=np.int64)},
            {"numpy": [kind, int(pos), int(has_gauss), float(gauss)],
             "python": [version, list(internal), gauss_next]})


def set_rng_state(tensors: dict, meta: dict) -> None:
    import torch

    torch.set_rng_state(tensors["rng.torch"])
    kind, pos, has_gauss, gauss = meta["numpy"]
    np.random.set_state((kind, np.asarray(tensors["rng.numpy"]).astype(np.uint32), pos,
                         has_gauss, gauss))
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))


def optimizer_state(state_dict: dict, prefix: str = "opt") -> tuple[dict, dict]:
    """A torch optimizer's state_dict as (tensors, meta): tensors by `prefix.<param>.<key>`."""
    import torch

    tensors, scalars = {}, {}
    for idx, entry in state_dict["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}.{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def optimizer_state_dict(tensors: dict, meta: dict, prefix: str = "opt") -> dict:
    """Inverse of `optimizer_state`: a state_dict for `optimizer.load_state_dict`."""
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith(f"{prefix}."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for name, value in meta["scalars"].items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


# ---- batches ---------------------------------------------------------------------------------
_RAGGED = {"prompt_ids": np.int64, "completion_ids": np.int64, "logprobs": np.float32,
           "entropy": np.float32}
_ARRAYS = ("correct", "format_score", "rewards")
_MEASURED = ("memory", "verifier_memory")
"""RolloutBatch fields that describe the worker when it ran, not the rollouts: not saved"""


def rollout_to_state(prefix: str, batch: RolloutBatch) -> tuple[dict, dict]:
    """(tensors, meta) of a RolloutBatch, names under `prefix`."""
    tensors = {}
    for name, dtype in _RAGGED.items():
        tensors.update(pack_rows(f"{prefix}.{name}", getattr(batch, name), dtype))
    for name in _ARRAYS:
        tensors[f"{prefix}.{name}"] = np.asarray(getattr(batch, name), dtype=np.float32)
    meta = {f.name: getattr(batch, f.name) for f in fields(batch)
            if f.name not in _RAGGED and f.name not in _ARRAYS and f.name not in _MEASURED}
    return tensors, meta


def rollout_from_state(prefix: str, tensors: dict, meta: dict) -> RolloutBatch:
    ragged = {name: unpack_rows(tensors, f"{prefix}.{name}") for name in _RAGGED}
    for name in ("prompt_ids", "completion_ids"):
        ragged[name] = [r.tolist() for r in ragged[name]]
    arrays = {name: np.asarray(tensors[f"{prefix}.{name}"]) for name in _ARRAYS}
    return RolloutBatch(**ragged, **arrays, **meta)


def train_batch_to_state(prefix: str, batch: TrainBatch) -> tuple[dict, dict]:
    tensors = {**pack_rows(f"{prefix}.prompt_ids", batch.prompt_ids, np.int64),
               **pack_rows(f"{prefix}.completion_ids", batch.completion_ids, np.int64),
               **pack_rows(f"{prefix}.old_logp", batch.old_logp, np.float32),
               **pack_rows(f"{prefix}.entropy", batch.entropy, np.float32),
               f"{prefix}.advantages": np.asarray(batch.advantages, dtype=np.float32)}
    if batch.keep is not None:
        tensors[f"{prefix}.keep"] = np.asarray(batch.keep, dtype=np.uint8)
    return tensors, {"version": batch.version, "keep": batch.keep is not None}


def train_batch_from_state(prefix: str, tensors: dict, meta: dict) -> TrainBatch:
    def ids(name):
        return [r.tolist() for r in unpack_rows(tensors, f"{prefix}.{name}")]

    keep = np.asarray(tensors[f"{prefix}.keep"]).astype(bool) if meta["keep"] else None
    return TrainBatch(ids("prompt_ids"), ids("completion_ids"),
                      unpack_rows(tensors, f"{prefix}.old_logp"),
                      unpack_rows(tensors, f"{prefix}.entropy"),
                      np.asarray(tensors[f"{prefix}.advantages"]), keep, meta["version"])
