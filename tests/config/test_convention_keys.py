"""The peer-convention settings (rlexp/algorithms/CONVENTIONS.md) are checked with the config, before anything
loads, each error naming its key; a part's key its function does not take is refused the same way."""

import pytest

from rlexp.config.schema import ConfigError, validate


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["algorithm.loss.log_ratio_clamp=-1"], r"^algorithm\.loss\.log_ratio_clamp=-1: must be > 0 or null"),
        (["algorithm.advantage.singleton=verl"], r"^algorithm\.advantage\.singleton=verl: must be one of"),
        (["algorithm.token_count_guard=1e-8"], r"^algorithm\.token_count_guard=1e-08: must be one of"),
        (["algorithm.unscored_rows=drop"], r"^algorithm\.unscored_rows=drop: must be one of"),
        (["algorithm.kl.clamp=true", "algorithm.kl.estimator=k1"], r"^algorithm\.kl\.clamp=True: is verl's k3"),
        (["algorithm.kl.bias_correction=true", "algorithm.kl.mode=reward"], r"^algorithm\.kl\.bias_correction=True"),
        (["eval.maj_missing=count"], r"^eval\.maj_missing='count': must be one of \['abstain', 'vote'\]"),
        (
            ["algorithm=gmpo", "+algorithm.loss.log_ratio_clamp=20"],
            r"^algorithm\.loss\.log_ratio_clamp is not a setting of rlexp\.algorithms\.losses\.sequence\.gmpo",
        ),
        (
            ["algorithm=reinforce_pp", "+algorithm.advantage.singleton=raw"],
            r"^algorithm\.advantage\.singleton is not a setting of rlexp\.algorithms\.advantages\.reinforce",
        ),
    ],
)
def test_bad_convention_settings_name_their_key(tiny_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny_cfg(*overrides))


def test_peer_settings_pass(tiny_cfg):
    validate(
        tiny_cfg(
            "algorithm.loss.log_ratio_clamp=20",
            "algorithm.advantage.singleton=raw",
            "algorithm.token_count_guard=eps",
            "algorithm.unscored_rows=exclude",
            "algorithm.kl.clamp=true",
            "algorithm.kl.bias_correction=true",
            "eval.maj_missing=vote",
        )
    )
