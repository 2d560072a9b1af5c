"""common.mmap_weights: a safetensors file's tensors as views of the file's pages."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.mmap_weights import mmap_tensors


def mapped_files(ptr: int) -> list[str]:
    """Paths of this process's mappings that contain address `ptr`."""
    hits = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi and len(parts) >= 6:
                hits.append(parts[5])
    return hits


def test_tensors_equal_the_file_and_live_in_its_pages(tmp_path):
    path = str(tmp_path / "w.safetensors")
    g = torch.Generator().manual_seed(0)
    stored = {"a.weight": torch.randn(64, 32, generator=g),
              "b.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16),
              "c.bias": torch.randn(3, generator=g)}
    save_file(stored, path)
    got = mmap_tensors(path, {"a.weight", "b.weight", "not.there"})
    assert set(got) == {"a.weight", "b.weight"}
    want = load_file(path)
    for k, t in got.items():
        assert t.dtype == want[k].dtype and torch.equal(t, want[k])
        assert path in mapped_files(t.data_ptr())  # a view of the file, not a copy
    a = got["a.weight"]
    a.add_(1.0)  # copy-on-write: the file is unchanged
    assert torch.equal(load_file(path)["a.weight"], stored["a.weight"])
    assert set(mmap_tensors(path)) == set(stored)


def test_an_unsupported_dtype_is_named(tmp_path):
    path = str(tmp_path / "w.safetensors")
    save_file({"m": torch.zeros(4, dtype=torch.uint8)}, path)
    with pytest.raises(ValueError, match="m has dtype U8; allowed: F32"):
        mmap_tensors(path)
