"""Datasets the web app's Train tab offers: the server's `--data-dir` and the page's uploads,
which are copied into the runs folder's `uploads/` (size-capped by the `Policy`)."""

from __future__ import annotations

import os
import re
import shutil

from launch.app.policy import Policy

DATASET_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
"""files the file task reads (a folder written by datasets' save_to_disk too)"""


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


def keep_upload(path: str, policy: Policy) -> str:
    """Copy an uploaded file (size-checked) into the uploads folder under a safe, unused name;
    returns its new path. Raises PolicyError when it is too big."""
    policy.check_upload(path)
    os.makedirs(policy.uploads_dir, exist_ok=True)
    stem, suffix = os.path.splitext(os.path.basename(path))
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:64] or "upload"
    suffix = suffix.lower() if suffix.lower() in DATASET_SUFFIXES else ".jsonl"
    target, i = os.path.join(policy.uploads_dir, stem + suffix), 1
    while os.path.exists(target):
        target, i = os.path.join(policy.uploads_dir, f"{stem}-{i}{suffix}"), i + 1
    shutil.copyfile(path, target)
    return target
