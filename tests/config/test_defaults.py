"""The default run is what the README says it is (issue 30: chosen by conf/sweep/default_task.yaml), and the
settings before it stay reachable as `+experiment=default_v1`."""

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rlexp.config.paths import CONF_DIR

README = Path(__file__).resolve().parents[2] / "README.md"


def _compose(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_default_run_is_the_swept_winner():
    cfg = _compose()
    options = cfg.dataset.options
    assert (cfg.dataset.name, list(options.operators), options.allow_parentheses, options.allow_negation) == (
        "basic_arithmetic",
        ["+", "-"],
        False,
        False,
    )
    assert (options.min_terms, options.max_terms, options.min_digits, options.max_digits) == (2, 2, 1, 2)
    t = cfg.trainer
    assert (t.max_steps, t.prompts_per_step, t.num_generations, t.max_new_tokens, t.temperature) == (36, 8, 8, 48, 0.7)
    assert cfg.optimizer.lr == 1e-5 and cfg.algorithm.name == "grpo"
    assert (cfg.eval.size, t.eval_every, t.eval_at_start) == (100, 18, True)
    assert cfg.reward.terms.format.require_end is False


def test_the_readme_states_the_default_run():
    cfg = _compose()
    t = cfg.trainer
    text = README.read_text()
    assert f"({t.max_steps} steps of {t.prompts_per_step} prompts × {t.num_generations} completions" in text
    assert "`arithmetic_add_sub`" in text and f"temperature {t.temperature}" in text


def test_the_old_default_is_an_experiment():
    cfg = _compose("+experiment=default_v1")
    assert cfg.dataset.name == "basic_arithmetic" and "operators" not in cfg.dataset.options
    assert (cfg.dataset.options.max_digits, cfg.trainer.max_steps, cfg.trainer.temperature) == (2, 30, 1.0)
    assert (cfg.eval.size, cfg.trainer.eval_every, cfg.trainer.eval_at_start) == (0, 0, False)
    assert cfg.reward.terms.format.require_end is False
