"""The metric names a train job returns, known from its config before anything trains
(rlexp.sweeping.metric_names): the names a job can return pass, a misspelt one is refused in one line naming
the key, the name and the closest names; outside the namespaces the config decides, only near misses of known
names are refused (a new algorithm's metrics must not be)."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rlexp.config.paths import CONF_DIR
from rlexp.sweeping.metric_names import MetricNameError, check_metric_name, produced_metrics
from rlexp.sweeping.settings import SweepConfigError


def produced(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return produced_metrics(compose(config_name="config", overrides=list(overrides)))


@pytest.fixture(scope="module")
def evaluated():
    return produced("eval.size=4")


@pytest.fixture(scope="module")
def benchmarks():
    return produced("+benchmark=offline", "eval.size=0")


def test_what_decides_the_names_is_read_from_the_config(evaluated, benchmarks):
    assert evaluated.reward_terms == {"accuracy", "format"} and evaluated.accuracy_term and evaluated.greedy_eval
    assert benchmarks.benchmarks == {"rg_basic_arithmetic", "rg_chain_sum", "rg_gsm_symbolic"}
    assert not benchmarks.greedy_eval and benchmarks.several_benchmarks
    assert not produced("trainer.accuracy_term=null").accuracy_term


@pytest.mark.parametrize(
    "name",
    [
        "reward/mean",
        "reward/accuracy/mean",
        "reward/format/failures",
        "accuracy",
        "eval/accuracy",
        "eval/length/mean",
        "length/truncated_frac",
        "entropy/mean",
        "loss/total",
        "grad_norm",
        "time/step_s",
        "groups/all_correct_frac",
        "clip/high_frac",
        "kl/mean",
        "loss/policy",  # an algorithm's own loss term: not listed here, not refused
        "dapo/new_metric",  # a namespace nobody listed yet
    ],
)
def test_names_a_job_can_return_pass(evaluated, name):
    check_metric_name(name, evaluated)


@pytest.mark.parametrize(
    "name",
    [
        "eval/rg_chain_sum/pass@1",
        "eval/rg_chain_sum/pass_at_4",
        "eval/rg_gsm_symbolic/maj@8",
        "eval/rg_basic_arithmetic/accuracy",
        "eval/rg_basic_arithmetic/length/median",
        "eval/rg_chain_sum/consistency/rederive_rate",
        "eval/mean/accuracy",
        "eval/rg_chain_sum/some_new_metric",
    ],
)
def test_benchmark_metrics_pass(benchmarks, name):
    check_metric_name(name, benchmarks)


@pytest.mark.parametrize(
    "name,message",
    [
        ("eval/acuracy", "'eval/acuracy' is not a metric these trials return; closest: eval/accuracy"),
        (
            "eval/gsm8k/accuracy",
            "'eval/gsm8k/accuracy' is not a metric these trials return (no +benchmark); closest: eval/accuracy",
        ),
        ("lenght/mean", "'lenght/mean' is not a metric these trials return; closest: length/mean"),
        ("acuracy", "'acuracy' is not a metric these trials return; closest: accuracy"),
        ("clip/hgh_frac", "'clip/hgh_frac' is not a metric these trials return; closest: clip/high_frac"),
        (
            "accuracy/mean",
            "'accuracy/mean' is not a metric ('accuracy' is one and has no sub-metrics); closest: reward/accuracy/mean",
        ),
        (
            "reward/acc/mean",
            "'reward/acc/mean' is not a metric these trials return (reward terms: ['accuracy', 'format']); closest: "
            "reward/accuracy/mean",
        ),
        ("reward/format", "'reward/format' is not a metric these trials return; closest: reward/format/"),
        ("length/median", "'length/median' is not a metric these trials return; closest: length/mean"),
        ("pass@1", "'pass@1' is a benchmark metric: name it eval/<benchmark>/pass_at_1"),
    ],
)
def test_a_misspelt_name_is_one_line_naming_the_key_and_the_closest_names(evaluated, name, message):
    with pytest.raises(MetricNameError) as e:
        check_metric_name(name, evaluated)
    text = str(e.value)
    assert isinstance(e.value, SweepConfigError) and "\n" not in text  # a config error: `rlexp` exits 2, one line
    assert text.startswith(f"hydra.sweeper.objective: {message}"), text
    assert text.endswith("(hydra.sweeper.check_objective=false skips this check)")


def test_benchmark_names_and_metrics_are_checked(benchmarks):
    with pytest.raises(MetricNameError, match=r"'eval/rg_chan_sum/accuracy' .*closest: eval/rg_chain_sum/accuracy"):
        check_metric_name("eval/rg_chan_sum/accuracy", benchmarks)
    with pytest.raises(MetricNameError, match=r"not a metric of benchmark 'rg_chain_sum'; closest: eval/rg_chain_sum/"):
        check_metric_name("eval/rg_chain_sum/acuracy", benchmarks)
    with pytest.raises(MetricNameError, match=r"closest: eval/mean/accuracy"):
        check_metric_name("eval/accuracy", benchmarks)  # no held-out greedy eval (eval.size=0), only benchmarks


def test_evaluation_and_the_accuracy_term_are_required_where_needed():
    with pytest.raises(MetricNameError, match=r"'eval/length/mean' needs evaluation, which these trials do not run"):
        check_metric_name("eval/length/mean", produced("eval.size=0"))
    no_term = produced("eval.size=4", "trainer.accuracy_term=null")
    check_metric_name("eval/length/mean", no_term)
    with pytest.raises(MetricNameError, match=r"'eval/accuracy' needs an accuracy term: trainer.accuracy_term"):
        check_metric_name("eval/accuracy", no_term)
    with pytest.raises(MetricNameError, match=r"^hydra.sweeper.report_metric: 'accuracy' needs an accuracy term"):
        check_metric_name("accuracy", no_term, key="hydra.sweeper.report_metric")
