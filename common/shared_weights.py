"""One fp32 copy of a half-precision checkpoint per machine, mapped by every process.

    path = shared_checkpoint(resolve_model(name), torch.float32)   # the folder to load from

Hub checkpoints are stored in bf16 (or fp16), and a CPU run computes in fp32 (common.device).
Loading such a file with `dtype=float32` gives every process (the learner, each HF rollout
worker) its own private fp32 copy: 1.84 GiB each for Qwen2-0.5B. Loading an fp32 file in fp32
does not copy: transformers keeps the tensors as views of a private (copy-on-write) map of the
safetensors file, so the page cache's pages are shared, and PSS counts them once per machine.

So the conversion is written once into the model cache, as a complete checkpoint folder
(config with `dtype: float32`, fp32 safetensors, the tokenizer and generation files copied),
one folder per source checkpoint and dtype. It is built with `common.model_cache.materialize`:
under the cache's build lock (concurrent workers wait for one build, not race), in a temp
folder renamed into place with a complete-marker written last (a killed build is redone).
The folder's name carries a digest of the source files' paths, sizes and mtimes, so an edited
checkpoint gets a new conversion rather than a stale one; the old one, like the conversion of a
checkpoint since deleted, goes when a model is next resolved for fp32 on the machine that built
it (`prune_stale_conversions`; a cache shared over NFS holds other machines' conversions, whose
sources this one may not see).

Tensors are converted one at a time and streamed into the file, so building Qwen2-0.5B holds one
tensor (its 0.5 GiB embedding) in memory, not the whole fp32 model.

A process that writes into the mapped weights (a full fine-tune's optimizer, a LoRA merge in
place) gets private copies of the pages it writes, so it stays correct but stops sharing them:
HF rollout workers keep LoRA unmerged on such a base (actors/hf_worker.py).
`HOMERL_SHARE_WEIGHTS=0` turns the conversion off (private copies, as transformers loads them).
torch is imported on first use only: the driver asks `sharing_enabled` for its RAM plan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from common.model_cache import entries, materialize, remove

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

CONVERTIBLE = {"BF16", "F16"}
"""stored dtypes whose fp32 conversion is exact, and so worth one shared copy"""
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""files not copied into a conversion (the shard index is: shard names are kept)"""


def sharing_enabled() -> bool:
    """False when `HOMERL_SHARE_WEIGHTS` is 0/false/no/off (each process converts privately)."""
    return os.environ.get("HOMERL_SHARE_WEIGHTS", "1").lower() not in {"0", "false", "no", "off"}


def _local_dir(path: str) -> Path | None:
    """The checkpoint's local folder: `path` itself, or a hub id's cached snapshot."""
    if Path(path).is_dir():
        return Path(path)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached: transformers loads it its own way
        return None


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def stored_dtypes(folder: Path) -> set[str]:
    """The safetensors dtypes (`BF16`, `F32`, `I64`, ...) of the folder's tensors."""
    from common.mmap_weights import read_header  # torch: the RAM planner imports this module

    kinds = set()
    for shard in _shards(folder):
        header, _ = read_header(str(shard))
        kinds |= {info["dtype"] for info in header.values()}
    return kinds


def _entry_name(folder: Path, dtype: torch.dtype) -> str:
    """`<folder>-<digest>-float32`: one cache entry per source checkpoint (its shards' paths,
    sizes and mtimes) and target dtype."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for shard in _shards(folder):
        st = shard.stat()
        digest.update(f"{shard.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return f"{folder.resolve().name}-{digest.hexdigest()[:12]}-{str(dtype).removeprefix('torch.')}"


def shared_checkpoint(path: str, dtype: torch.dtype) -> str:
    """The folder to load `path` from in `dtype`: its cached fp32 conversion when `dtype` is
    fp32 and the checkpoint stores bf16/fp16 safetensors; otherwise `path` unchanged."""
    import torch

    from common.mmap_weights import DTYPES  # torch, only when converting (see read_header's)

    if dtype != torch.float32 or not sharing_enabled():
        return path
    prune_stale_conversions()
    folder = _local_dir(path)
    if folder is None or not _shards(folder):
        return path
    kinds = stored_dtypes(folder)
    if not kinds & CONVERTIBLE or not kinds <= set(DTYPES):  # nothing to convert, or unknown
        return path
    meta = {"source": str(folder.resolve()), "dtype": str(dtype).removeprefix("torch."),
            "host": socket.gethostname()}
    entry = materialize(_entry_name(folder, dtype),
                        lambda out: convert_checkpoint(folder, out, dtype), meta=meta,
                        hint=lambda: _full_disk_hint(folder))
    return str(entry)


def _full_disk_hint(folder: Path) -> str:
    """The end of the error when the cache's disk will not take `folder`'s fp32 copy."""
    need = 2 * sum(shard.stat().st_size for shard in _shards(folder))  # fp32: ~2x the half
    size = next(f"{need / 2**k:.1f} {unit}" for k, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"),
                                                               (0, "bytes")) if need >= 2**k)
    return (f" (the fp32 copy of {folder} takes about {size}), or set HOMERL_SHARE_WEIGHTS=0 "
            "(each process then holds a private fp32 copy in RAM instead)")


def prune_stale_conversions() -> list[str]:
    """Delete the conversions whose source checkpoint is gone, or has changed since (its
    conversion now has another name): without this, each deleted or re-saved half-precision
    checkpoint would leave its full fp32 copy in the cache for good (2 GiB for Qwen2-0.5B).
    Left alone: entries from before the marker named their source, and those another machine
    built (a cache shared over NFS while sources stay on each node's own disk: this machine
    cannot see their source, and would delete a conversion in use there). Returns their names."""
    import torch

    stale, host = [], socket.gethostname()
    for path, marker in entries():
        source, dtype = marker.get("source"), getattr(torch, marker.get("dtype") or "", None)
        built_here = marker.get("host", host) == host  # markers before hosts: this machine's
        if source is None or not isinstance(dtype, torch.dtype) or not built_here:
            continue
        folder = Path(source)
        if not _shards(folder) or _entry_name(folder, dtype) != path.name:
            try:
                remove(path.name)
            except OSError as e:  # housekeeping: a cache this user cannot write fails no run
                if path.name not in _KEPT:
                    log.warning("left the stale model conversion %s in place: %s", path, e)
                    _KEPT.add(path.name)
                continue
            stale.append(path.name)
    return stale


_KEPT: set[str] = set()
"""stale conversions this process could not delete (each reported once)"""


def convert_checkpoint(src: Path, out: Path, dtype: torch.dtype) -> None:
    """Write `src` (a safetensors checkpoint folder) to `out` with its bf16/fp16 tensors cast
    to `dtype`; every other file is copied, config.json's dtype rewritten."""
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy(item, out / item.name)
    config = out / "config.json"
    if config.exists():
        raw = json.loads(config.read_text())
        name = str(dtype).removeprefix("torch.")
        raw["dtype"] = name
        if "torch_dtype" in raw:
            raw["torch_dtype"] = name
        config.write_text(json.dumps(raw, indent=2))
    for shard in _shards(src):
        write_converted(shard, out / shard.name, dtype)


def write_converted(src: Path, dst: Path, dtype: torch.dtype) -> None:
    """A safetensors file with `src`'s tensors, the convertible ones cast to `dtype`, streamed
    tensor by tensor (the header first, then each tensor's bytes at its 8-aligned offset)."""
    from common.mmap_weights import DTYPES, mmap_tensors, read_header  # torch (see above)

    names = {v: k for k, v in DTYPES.items()}
    header, _ = read_header(str(src))
    with open(src, "rb") as f:  # read_header drops the metadata; transformers wants it kept
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little"))).get("__metadata__")
    out_header, offset, plan = {}, 0, []
    for name, info in header.items():
        kind = names[dtype] if info["dtype"] in CONVERTIBLE else info["dtype"]
        nbytes = math.prod(info["shape"]) * DTYPES[kind].itemsize
        out_header[name] = {"dtype": kind, "shape": info["shape"],
                            "data_offsets": [offset, offset + nbytes]}
        plan.append((name, DTYPES[kind]))
        offset += nbytes
    if meta is not None:
        out_header["__metadata__"] = meta
    blob = json.dumps(out_header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # tensors start 8-aligned: mapped views need no copy
    source = mmap_tensors(str(src))  # views of the file: pages, not a loaded copy
    with open(dst, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, target in plan:
            f.write(memoryview(source.pop(name).to(target).contiguous().reshape(-1).numpy()))
        f.flush()
        os.fsync(f.fileno())
