"""HAPO's entropy signal ĥ (rlexp.core.entropy), worked by hand on five tokens."""

import math

import pytest
import torch

from rlexp.core.entropy import entropy_scale, entropy_signal, normalised_entropy


def five_tokens():
    # log-entropies 0, 1, 2, 3, 4 on the valid tokens of two rows (the last position of row 1 is padding)
    entropy = torch.tensor([[1.0, math.e, math.e**2], [math.e**3, math.e**4, 123.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return entropy, mask


def test_scale_by_hand():
    # pivot: the 0.8 quantile of [0, 1, 2, 3, 4], nearest rank 0.8·4 = 3.2 → 3
    # h = ℓ − 3 = [−3, −2, −1, 0, 1]; spread = sqrt((9 + 4 + 1 + 0 + 1)/5) = sqrt(3)
    # h / sqrt(3): max 1/sqrt(3) → scale_pos = sqrt(3); min −3/sqrt(3) = −sqrt(3) → scale_neg = 1/sqrt(3)
    s = entropy_scale(*five_tokens())
    assert s.pivot == pytest.approx(3.0)
    assert s.spread == pytest.approx(math.sqrt(3))
    assert s.scale_pos == pytest.approx(math.sqrt(3))
    assert s.scale_neg == pytest.approx(1 / math.sqrt(3))


def test_signal_by_hand():
    # ĥ = h/sqrt(3) · sqrt(3) = 1 for ℓ = 4; h/sqrt(3) · 1/sqrt(3) = h/3 for h ≤ 0: −1, −2/3, −1/3, 0; padding 0
    h = entropy_signal(*five_tokens())
    assert torch.allclose(h, torch.tensor([[-1.0, -2 / 3, -1 / 3], [0.0, 1.0, 0.0]]), atol=1e-6)


def test_released_sign_mirrors_the_low_side():
    # the release divides the negative side by min h (< 0): ĥ = +1, +2/3, +1/3 there
    entropy, mask = five_tokens()
    h = entropy_signal(entropy, mask, released_sign=True)
    assert torch.allclose(h, torch.tensor([[1.0, 2 / 3, 1 / 3], [0.0, 1.0, 0.0]]), atol=1e-6)


def test_later_entropies_use_the_batch_statistics():
    # ℓ = 5 → h = 2/sqrt(3) → ĥ = 2 (unclamped: beyond the batch's own range)
    s = entropy_scale(*five_tokens())
    assert float(normalised_entropy(torch.tensor([math.e**5]), s)) == pytest.approx(2.0)


def test_no_valid_tokens_is_neutral():
    s = entropy_scale(torch.ones(2, 2), torch.zeros(2, 2))
    assert (s.pivot, s.spread) == (0.0, 1.0)
