"""trainer.device names a device this machine has, checked with the config before anything loads (issue 16:
`trainer.device=cuda` on a CPU machine failed deep inside model loading)."""

import pytest
import torch

from rlexp.config.schema import ConfigError, validate


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cuda_on_a_machine_without_it(tiny_cfg, no_cuda):
    with pytest.raises(ConfigError, match=r"^trainer\.device=cuda: CUDA is not available on this machine \(torch "):
        validate(tiny_cfg("trainer.device=cuda"))
    with pytest.raises(ConfigError, match=r"^trainer\.device=cuda:0: CUDA is not available"):
        validate(tiny_cfg("trainer.device=cuda:0"))
    validate(tiny_cfg("trainer.device=cpu"))
    validate(tiny_cfg("trainer.device=auto"))


def test_cuda_index_beyond_the_device_count(tiny_cfg, two_gpus):
    with pytest.raises(ConfigError) as e:
        validate(tiny_cfg("trainer.device=cuda:3"))
    assert str(e.value) == "trainer.device=cuda:3: this machine has 2 CUDA device(s), cuda:0 to cuda:1"
    validate(tiny_cfg("trainer.device=cuda:1"))
    validate(tiny_cfg("trainer.device=cuda"))


def test_not_a_device(tiny_cfg):
    with pytest.raises(ConfigError, match=r"^trainer\.device='gpu' is not a device: auto, cpu, cuda, cuda:N or mps$"):
        validate(tiny_cfg("trainer.device=gpu"))


def test_train_app_stops_before_the_model_loads(tiny_cfg, no_cuda, monkeypatch):
    import rlexp.models.loading as loading
    from rlexp.runs.training import run

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", no_model)
    with pytest.raises(ConfigError, match=r"trainer\.device=cuda:"):
        run(tiny_cfg("trainer.device=cuda"))
