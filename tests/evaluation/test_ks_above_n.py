"""eval.ks / eval.maj_ks above eval.n are refused when the config is checked, before a model loads, in one line
naming both keys (issue 16: they used to vanish from the results)."""

import pytest

from rlexp.config.schema import ConfigError, validate
from rlexp.evaluation.runner import EvalSettings
from tests.conftest import compose_train


def test_train_config_refuses_ks_above_n(tiny_cfg):
    cfg = tiny_cfg("eval.n=4", "eval.ks=[1,2,8]")
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value) == (
        "eval.ks=[1, 2, 8]: k=8 is more than eval.n=4 samples per problem; raise eval.n or keep every k <= 4"
    )
    with pytest.raises(ConfigError, match=r"^eval\.maj_ks=\[5\]: k=5 is more than eval\.n=4"):
        validate(tiny_cfg("eval.n=4", "eval.maj_ks=[5]"))
    validate(tiny_cfg("eval.n=8", "eval.ks=[1,2,8]"))  # k = n is fine


def test_eval_settings_refuse_ks_above_n():
    with pytest.raises(ConfigError, match=r"eval\.ks=\[16\]: k=16 is more than eval\.n=8"):
        EvalSettings(n=8, ks=[16])


def test_eval_app_refuses_ks_above_n_before_loading_anything(tmp_path, monkeypatch):
    import rlexp.models.loading as loading
    from rlexp.runs.evaluation import run_eval

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", no_model)
    cfg = compose_train(
        ["model=tiny", "benchmark=rg_chain_sum", "eval.n=4", "eval.ks=[1,4,10]", "tracker=none"], tmp_path / "r", "eval"
    )
    with pytest.raises(ConfigError, match=r"^eval\.ks=\[1, 4, 10\]: k=10 is more than eval\.n=4"):
        run_eval(cfg)
