"""Train-inference mismatch corrections (truncated / masked IS, token and sequence level, rejection), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.regularisers.rollout_correction import RolloutCorrection

# log r = log π_train − log π_sampler per token; row 1's last token is padding
TRAIN = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
SAMPLER = torch.tensor([[-1.0, 0.5, 0.0], [-0.2, -0.3, 9.0]])  # log r = [1, -0.5, 0], [0.2, 0.3, (pad)]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _w(mode, c):
    return RolloutCorrection(mode, c)(TRAIN, SAMPLER, MASK)


def test_token_truncate_and_mask():
    w, stats = _w("token_truncate", 2.0)
    e = math.exp
    torch.testing.assert_close(w, torch.tensor([[2.0, e(-0.5), 1.0], [e(0.2), e(0.3), 0.0]]))
    assert stats["rollout_correction/affected_frac"] == pytest.approx(1 / 5)
    w, _ = _w("token_mask", 2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, e(-0.5), 1.0], [e(0.2), e(0.3), 0.0]]))


def test_sequence_truncate_mask_and_reject():
    e = math.exp
    w, _ = _w("sequence_truncate", 1.5)  # row ratios e^0.5 = 1.65 (cut to 1.5) and e^0.5 as well
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [1.5, 1.5, 0.0]]))
    w, _ = _w("sequence_mask", 1.7)  # e^0.5 = 1.6487 ≤ 1.7: kept, with its weight
    torch.testing.assert_close(w, torch.tensor([[e(0.5)] * 3, [e(0.5), e(0.5), 0.0]]))
    # rejection on the geometric-mean ratio: row 0 mean log r = 0.5/3, row 1 = 0.5/2 = 0.25 > log 1.2 = 0.182
    w, stats = _w("sequence_reject", 1.2)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert stats["rollout_correction/affected_frac"] == pytest.approx(2 / 5)


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="rollout_correction.mode"):
        RolloutCorrection("nope")
    with pytest.raises(ValueError, match="rollout_correction.threshold"):
        RolloutCorrection("sequence_reject", 1.0)


def test_config_time_check(tmp_path):
    from rlexp.config.schema import ConfigError, validate
    from tests.conftest import compose_train

    cfg = compose_train(["trainer.rollout_correction=token_clip", "model=tiny"], tmp_path)
    with pytest.raises(ConfigError, match="trainer.rollout_correction=token_clip"):
        validate(cfg)
