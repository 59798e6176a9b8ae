"""One seed (trainer.seed) drives Python, NumPy, torch and the data (generation and order): two CPU
runs with the same seed produce the same first-step prompts, completions and rewards; another seed
produces different ones."""

import random
import zlib

import numpy as np
import torch

from rlexp.rewards.terms import RewardTerm
from rlexp.runs.setup import seed_everything
from rlexp.runs.training import run
from tests.conftest import TINY, compose_train


class TextFingerprint(RewardTerm):
    """A reward that differs between completions (the tiny random model never earns accuracy):
    a hash of the completion text in [0, 1). Records what it scored, in order."""

    seen: list = []

    def score(self, sample):
        value = (zlib.crc32(sample.completion.encode()) % 10_000) / 10_000
        TextFingerprint.seen.append((sample.prompt, sample.completion, value))
        return value


FINGERPRINT = "+reward.terms.fingerprint={_target_: tests.test_determinism.TextFingerprint, weight: 1.0}"


def first_step(tmp_path, name, seed):
    TextFingerprint.seen = []
    cfg = compose_train(
        [*TINY, "trainer.max_steps=1", f"trainer.seed={seed}", "trainer.device=cpu", FINGERPRINT], tmp_path / name
    )
    result = run(cfg)
    return list(TextFingerprint.seen), result.metrics


def test_same_seed_same_first_step_rewards_other_seed_differs(tmp_path):
    a, ma = first_step(tmp_path, "a", seed=3)
    b, mb = first_step(tmp_path, "b", seed=3)
    c, mc = first_step(tmp_path, "c", seed=4)
    assert len(a) == 2 * 4  # prompts_per_step x num_generations
    assert a == b, "same seed: same prompts, completions and rewards"
    assert ma["reward/mean"] == mb["reward/mean"] and ma["reward/fingerprint/mean"] == mb["reward/fingerprint/mean"]
    assert ma["entropy/mean"] == mb["entropy/mean"] and ma["loss/total"] == mb["loss/total"]
    assert [x[0] for x in a] != [x[0] for x in c], "another seed: other prompts (data generation and order)"
    assert [x[2] for x in a] != [x[2] for x in c], "another seed: other rewards"
    assert ma["reward/fingerprint/mean"] != mc["reward/fingerprint/mean"]


def test_seed_everything_seeds_python_numpy_torch():
    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    seed_everything(11)
    first = draw()
    seed_everything(11)
    assert draw() == first
    seed_everything(12)
    assert all(x != y for x, y in zip(draw(), first))
