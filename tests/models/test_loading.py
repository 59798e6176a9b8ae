"""The one-time GGUF conversion leaves the global RNG as it found it, so the first run on a machine (which
converts) samples exactly as every later run (which loads the converted copy)."""

from __future__ import annotations

import torch

from rlexp.models import loading


def test_conversion_does_not_draw_from_the_global_rng(tmp_path, monkeypatch):
    drew = []

    def fake_convert(src, target):  # building a model from its config initialises weights: draws from the RNG
        drew.append(torch.rand(3))

    monkeypatch.setattr(loading, "_convert", fake_convert)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    target = loading.convert_gguf_once("unused", "model.gguf", cache_dir=tmp_path / "cache", gguf_path=str(gguf))
    assert drew and (target / ".complete").exists()
    assert torch.equal(torch.rand(4), expected)
    # the second call only loads: nothing converted, nothing drawn
    loading.convert_gguf_once("unused", "model.gguf", cache_dir=tmp_path / "cache", gguf_path=str(gguf))
    assert len(drew) == 1
