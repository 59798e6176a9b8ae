"""``trainer.device`` (rlexp/runs/setup.py ``resolve_device``)."""

import torch

from rlexp.runs.setup import resolve_device


def test_auto_is_the_cpu_under_accelerates_cpu_launch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # `accelerate launch --cpu`
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cuda:1") == torch.device("cuda:1")  # an explicit device is kept
