"""Datasets the web app's Train tab offers: the server's `--data-dir` and the page's uploads.

An upload is copied into the runs folder's `.uploads/` (`Policy.uploads_dir`): a dot-folder
that the run list never shows and the policy never takes for a run, under a name the server
chooses (the original's letters, digits and `_.-`, never a run's own file name such as
config.json or metrics.jsonl, never a dot-file), size-capped one by one and in total. Gradio's
temporary copy is removed once the upload is kept or refused.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading

from launch.app.policy import Policy

DATASET_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
"""files the file task reads (a folder written by datasets' save_to_disk too)"""
RUN_FILE_STEMS = ("config", "metrics", "samples", "summary", "app", "config-history", "state",
                  "homerl")
"""stems of the files a run directory holds: an upload is never named like one"""

_KEEPING = threading.Lock()  # the uploads' total is checked and grown by one upload at a time


def _datasets_in(folder: str, newest_last: bool = False) -> list[str]:
    if not folder or not os.path.isdir(folder):
        return []
    out = []
    names = sorted(os.listdir(folder))
    if newest_last:
        names.sort(key=lambda n: os.path.getmtime(os.path.join(folder, n)))
    for name in names:
        path = os.path.join(folder, name)
        saved = os.path.isdir(path) and any(
            os.path.exists(os.path.join(path, f)) for f in ("dataset_info.json",
                                                            "dataset_dict.json", "state.json"))
        if saved or (os.path.isfile(path) and name.lower().endswith(DATASET_SUFFIXES)):
            out.append(path)
    return out


def dataset_choices(policy: Policy) -> list[str]:
    """Datasets a page may train on: --data-dir's, then the uploads (newest last)."""
    return _datasets_in(policy.data_dir) + _datasets_in(policy.uploads_dir, newest_last=True)


def upload_name(original: str) -> tuple[str, str]:
    """(stem, suffix) the server gives an upload named `original`: letters, digits and `_.-`,
    no leading dot, a dataset suffix, and never a run's own file name."""
    stem, suffix = os.path.splitext(os.path.basename(original))
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:64].lstrip("._-") or "upload"
    if stem.lower() in RUN_FILE_STEMS:
        stem = f"upload-{stem}"
    suffix = suffix.lower() if suffix.lower() in DATASET_SUFFIXES else ".jsonl"
    return stem, suffix


def _kept_bytes(folder: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, name))
    return total


def keep_upload(path: str, policy: Policy) -> str:
    """Copy an uploaded file (size-checked, and the uploads' total) into the uploads folder under
    a name the server chooses; returns its new path. Raises PolicyError when it does not fit."""
    policy.check_upload(path)
    with _KEEPING:
        os.makedirs(policy.uploads_dir, exist_ok=True)
        policy.check_uploads_total(_kept_bytes(policy.uploads_dir), os.path.getsize(path))
        stem, suffix = upload_name(path)
        target, i = os.path.join(policy.uploads_dir, stem + suffix), 1
        while os.path.exists(target):
            target, i = os.path.join(policy.uploads_dir, f"{stem}-{i}{suffix}"), i + 1
        shutil.copyfile(path, target)
    return target


def discard_temporary(path: str, temp_root: str) -> None:
    """Remove Gradio's temporary copy `path` and the folders it emptied, up to `temp_root`
    (nothing outside `temp_root` is touched)."""
    root = os.path.realpath(temp_root)
    real = os.path.realpath(path)
    if os.path.commonpath([real, root]) != root or real == root:
        return
    with contextlib.suppress(OSError):
        os.remove(real)
    folder = os.path.dirname(real)
    while folder != root and os.path.commonpath([folder, root]) == root:
        try:
            os.rmdir(folder)  # only when empty
        except OSError:
            break
        folder = os.path.dirname(folder)


def accept_upload(path: str, policy: Policy, temp_root: str) -> str:
    """keep_upload, then Gradio's temporary copy removed (also when the upload is refused)."""
    try:
        return keep_upload(path, policy)
    finally:
        discard_temporary(path, temp_root)
