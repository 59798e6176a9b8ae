"""Every method in conf/algorithm/ trains two steps on the tiny model (through ``rlexp.runs.training.run``).

The tiny model's random answers are never correct, so the accuracy term is swapped for a test
reward that varies between completions (``varying_reward.VowelShare``): groups then have reward
variance and every method produces non-zero advantages and a real update.
"""

import math
import re
from pathlib import Path

import pytest

from rlexp.config.paths import CONF_DIR
from rlexp.runs.training import run
from tests.algorithms.test_arpo import ARPO_TINY
from tests.algorithms.test_at_grpo import AT_GRPO
from tests.algorithms.test_igpo import MULTI_TURN
from tests.algorithms.test_spa_rl import SPA_RL
from tests.algorithms.test_ssrl import SELF_SEARCH_RUN
from tests.algorithms.test_stepsearch import SEARCH_RUN
from tests.algorithms.test_supo import SUPO
from tests.algorithms.test_tapo_tool import MULTI_TURN as TAPO_TOOL
from tests.algorithms.varying_reward import VARYING

# methods run through TRL's trainers (``backend: trl``: DPO, KTO, ORPO, online DPO) have no advantage; tests/preference
CONFIGS = {p.stem: p.read_text() for p in (Path(CONF_DIR) / "algorithm").glob("*.yaml")}
METHODS = sorted(m for m, text in CONFIGS.items() if "\nbackend: trl" not in text)


def _family(text: str) -> str | None:
    found = re.search(r"(?m)^family: (\S+)", text)
    return found.group(1) if found else None


# multi-turn methods roll out episodes with a sandboxed tool in every one (~15 s each), CoMAS three rounds of replies
# a step; Cooper and RL Tango build and train a second model; direct_advantage_po samples Monte-Carlo continuations:
# long suite only
MULTI_TURN_METHODS = {"arpo", "at_grpo", "comas", "gigpo", "igpo", "spa_rl", "stepsearch", "supo", "tapo_tool"}
LONG_ONLY = MULTI_TURN_METHODS | {"cooper", "rl_tango", "direct_advantage_po"}
# the default suite runs GRPO and the first (other) method of each family; every method runs in the long suite (CI
# runs both): ~95 two-step runs took four of the default suite's ten minutes
_FAST_METHODS = [m for m in METHODS if m not in LONG_ONLY]
# a family's core method stands for it where the first name would be a newer variant
REPRESENTATIVES = {"actor-critic": "ppo", "group-baseline": "bnpo"}
FIRST_OF_FAMILY = {"grpo"} | {
    REPRESENTATIVES.get(f) or min(m for m in _FAST_METHODS if _family(CONFIGS[m]) == f)
    for f in {_family(CONFIGS[m]) for m in _FAST_METHODS}
}
METHOD_PARAMS = [m if m in FIRST_OF_FAMILY else pytest.param(m, marks=pytest.mark.long) for m in METHODS]
FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]  # keep ~20 runs cheap


def test_the_library_has_the_methods_of_issue_3():
    wanted = {
        "grpo",
        "dr_grpo",
        "dapo",
        "gspo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "remax",
        "opo",
        "gpg",
        "lite_ppo",
        "bnpo",
        "gdpo",
        "cispo",
        "sapo",
        "clip_cov",
        "kl_cov",
        "gmpo",
        "ppo",
        "reinforce",
    }
    assert wanted <= set(METHODS), wanted - set(METHODS)


# methods that split completions into correct and wrong: the vowel share (~0.4 here) counts as correct from 0.4
SPLIT = ["algorithm.advantage.positive_min=0.4", "trainer.num_generations=4"]
SPLIT_AT = {
    "gtpo": SPLIT,
    # the tiny model never ends a completion, so the papers' unfinished-continuation value 0 would zero every MC value
    "vineppo": ["algorithm.group_stages.0.truncated_reward=null"],
    "spo_chain": ["algorithm.group_stages.0.truncated_reward=null"],
    # the tiny model never ends a completion: every row is truncated, the finished-only critic never trains
    "t_ppo": ["algorithm.advantage.reward_truncated=true"],
    # the tree methods' advantages read their tree rollout's node paths
    "treepo": ["rollout=tree"],
    "treerl": ["rollout=eptree"],
    "spo_tree": ["rollout=spo_tree"],
    # TP-GRPO's thoughts come from a process term: the varying reward stands in for it (each completion one thought)
    "tp_grpo": [
        "+reward.terms.prm._target_=tests.algorithms.varying_reward.VowelShare",
        "trainer.num_generations=4",
        "algorithm.group_stages.0.correct_min=0.4",
    ],
    "grpo_s": SPLIT,
    "knapsack_grpo": ["sampler=knapsack"],  # its merge stage needs the knapsack sampler's allocation
    "pf_ppo": ["trainer.num_generations=4"],  # keeps the best and worst of each group: more than 2 to filter
    "hbpo": ["algorithm.advantage.correct_min=0.4", "trainer.num_generations=4"],  # 4 budgets: one completion each
    "e1_effort": ["algorithm.group_stages.0.correct_min=0.4", "trainer.num_generations=4"],
    # the test reward has no format term: constrain its one term instead
    # half the negative tokens (enough to select some in tiny micro-batches); κ = 0.2 filters part of the tiny model's
    # near-uniform distribution, so the proxy is above the policy on the tokens it keeps
    "apo": ["algorithm.advantage.correct_min=0.4", "trainer.num_generations=4"],
    "lp_reg": ["algorithm.loss.rho=0.5", "algorithm.loss.minp=0.2"],
    # the tiny model makes no search calls: stratify by vowel count instead (varies between its completions)
    "stratified_grpo": [
        "algorithm.advantage.pattern='[aeiou]'",
        "algorithm.advantage.max_stratum=30",
        "trainer.num_generations=4",
    ],
    # multiple-choice records; the vowel share (the test's accuracy) counts as correct from 0.4
    # the tiny model states no answers, so its vote reward would be 0 everywhere: the varying reward stands in for it
    "ttrl": ["+reward.terms.majority._target_=tests.algorithms.varying_reward.VowelShare"],
    "georeason_lcr": ["view=multiple_choice", "prompt=tag", "trainer.num_generations=4"],
    "acre": [
        "view=multiple_choice",
        "prompt=tag",
        "algorithm.group_stages.0.correct_min=0.4",
        "trainer.num_generations=4",
    ],
    # the tiny model states no answers: its votes and similarities are all 0, so the varying reward stands in
    # (co_reward: kept at weight 1 by dropping the no-label guard); k wordings need G divisible by k, 2 rows each
    "co_reward": ["algorithm.group_stages.0.label_term=null", "trainer.num_generations=4"],
    "ps_grpo": ["trainer.num_generations=4"],
    # KnowRL's stage refuses a run without its consensus term: the varying reward stands in for it
    "rlccf": ["algorithm.group_stages.0.label_term=null"],  # the varying reward stands in for the vote (see co_reward)
    "knowrl": ["+reward.terms.consensus._target_=tests.algorithms.varying_reward.VowelShare"],
    # KLCF's stage refuses a run without its two factuality terms: the varying reward stands in for both
    "klcf": [
        "+reward.terms.checklist_recall._target_=tests.algorithms.varying_reward.VowelShare",
        "+reward.terms.self_precision._target_=tests.algorithms.varying_reward.VowelShare",
    ],
    "info_consistent_grpo": ["trainer.num_generations=4"],
    "constrained_rlhf": ["algorithm.group_stages.0.constraints=[{term:accuracy,threshold:0.9,direction:min}]"],
    # PROF filters on a PRM term: the varying reward stands in for it; it drops half of each group of 4
    "prof": ["+reward.terms.prm._target_=tests.algorithms.varying_reward.VowelShare", "trainer.num_generations=4"],
    # IGPO needs multi-turn episodes: the tiny model's first turn is a scripted Python call (the tool really runs)
    "igpo": MULTI_TURN,
    "gigpo": MULTI_TURN,
    "arpo": ARPO_TINY,
    "at_grpo": AT_GRPO,
    "spa_rl": SPA_RL,
    "supo": [o for o in SUPO if o != "algorithm=supo"],
    "tapo_tool": TAPO_TOOL,
    "stepsearch": SEARCH_RUN,
    "ssrl": SELF_SEARCH_RUN,
    "comas": ["algorithm.group_stages.0.label_term=null"],  # the varying reward stands in (see co_reward)
}


@pytest.mark.parametrize("method", METHOD_PARAMS)
def test_method_trains_two_steps(method, tiny_cfg):
    result = run(tiny_cfg(*VARYING, *FAST, f"algorithm={method}", *SPLIT_AT.get(method, [])))
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["advantage/abs_mean"] > 0, "no learning signal despite varying rewards"
    if method == "ppo":
        assert m["critic/value_loss"] > 0 and math.isfinite(m["critic/grad_norm"])
    if method == "remax":
        assert "remax/greedy_reward_mean" in m
    if method.startswith("dapo"):
        assert m["dynamic_sampling/kept_groups"] >= 1 and "reward/overlong/mean" in m
    # issue 20 §3: each method's update mechanism acts in the run
    if method == "mdpo":  # 4 full-batch steps; the KL to the sampling policy acts from the second
        assert m["train/optimizer_steps"] == 4.0 and m["mdpo/kl"] > 0 and m["mdpo/kl_coef"] > 1.0
    if method in ("acre", "georeason_lcr"):  # every completion was re-asked with shuffled options
        assert "acre/consistent_frac" in m and "reward/acre/mean" in m or "reward/lcr/mean" in m
    if method == "ttrl":  # the vote stage logged what the label-free run decides
        assert "votes/no_answer_group_frac" in m
    if method == "restrain":  # label-free: the vote stage ran and the advantage read its clusters
        assert "votes/no_answer_group_frac" in m and "restrain/penalised_group_frac" in m
    if method in ("co_reward", "ps_grpo", "info_consistent_grpo"):  # each group was sampled over its wordings
        assert {"co_reward": "co_reward/no_label_frac", "ps_grpo": "paraphrase/answer_agreement"}.get(
            method, "info_consistent/answer_entropy_mean"
        ) in m
    if method == "rlccf":  # the peers were sampled and voted (the tiny model states few answers: no label)
        assert "rlccf/no_label_frac" in m
    if method == "klcf":  # the dual-fact stage combined recall and precision
        assert "klcf/f1_mean" in m
    if method == "knowrl":  # the feasibility votes were counted
        assert "self_knowledge/no_consensus_frac" in m
    if method == "stratified_grpo":  # completions of a group fall into several strata
        assert m["stratified/strata_per_group"] > 1.0
    if method == "sfpo":  # (3 fast + 1 slow) passes of 2 mini-batches (2 groups), repositioned
        assert m["train/optimizer_steps"] == 8.0 and m["sfpo/active"] == 1.0 and m["sfpo/fast_displacement"] > 0
    if method == "copg":  # the β-term at the current weights
        assert m["copg/kl_term_abs"] > 0
    if method == "a_lol":  # the sequence weight leaves 1 on the second mini-batch
        assert m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0
        assert 0.0 <= m["a_lol/dropped_frac"] <= 1.0
    if method == "troll":  # the projection's quantities on the old support (tests/algorithms/test_trust_region.py)
        assert m["troll/support"] > 1 and m["troll/kl_projected"] <= 0.05 + 1e-6
    if method == "nlpo":  # the masking policy allows a subset of the vocabulary (tests/algorithms/test_action_mask.py)
        assert 1 <= m["action_mask/allowed"] < 49152
    if method == "aent":  # the clamped entropy measured and the band controller's coefficient logged
        assert m["entropy_bonus/entropy"] > 0 and m["entropy_bonus/coef"] > 0
    if method == "spine":  # the band acts on the forking tokens
        assert m["entropy/selected_frac"] < 0.5 and m["entropy_band/above"] > 0
    # issue 24: the online pairwise methods found pairs in their groups and their mechanism acted
    if method in ("spo_minimax", "p3o", "cpl", "dno", "trpa", "egpo"):
        assert m["pref/pairs_per_group"] > 0
    if method == "spo_minimax":  # the win rate separates the completions of a group
        assert m["spo/win_rate_std"] > 0
    if method == "p3o":  # 4 PPO epochs: the ratio leaves 1 from the second
        assert m["train/optimizer_steps"] == 4.0 and (m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0)
    if method in ("cpl", "dno", "trpa", "egpo"):  # the pairwise loss was computed on the step's pairs
        assert m["pref/pairs"] > 0 and math.isfinite(m["pref/pair_loss"])
    if method == "dno":  # against π_t the margin is 0 in the first epoch only
        assert m["pref/margin"] != 0.0
    if method == "trpa":  # the second mini-batch's KL to the rollout policy
        assert m["trust_region/kl"] > 0
    if method == "egpo":  # step 2 restored the backup the look-ahead of step 1 took
        assert m["egpo/lookahead"] == 0.0 and m["egpo/lookahead_distance"] > 0
    if method == "hbpo":  # budget subgroups and their reward
        assert "hbpo/reward_mean" in m and 0.0 <= m["hbpo/within_budget_frac"] <= 1.0
    if method == "e1_effort":  # effort targets relative to the group's mean length
        assert m["e1/target_length_mean"] > 0 and 0.0 <= m["e1/within_effort_frac"] <= 1.0
    if method == "constrained_rlhf":  # the violated constraint's multiplier grows from 0 after step 1
        assert m["lagrange/accuracy/violation"] > 0 and m["lagrange/accuracy/multiplier"] > 0
    if method == "adaptive_entropy":  # the tiny model's entropy (~10 nats) is far above the target: the bonus is off
        assert m["entropy_bonus/coef"] == 0.0 and m["entropy_bonus/entropy"] > 0.5
    if method == "lp_reg":  # the old policy's min-p proxy reaches the loss and tokens are regularised toward it
        assert m["lp_reg/selected_frac"] > 0 and m["lp_reg/kl"] > 0
    if method == "apo":  # the KL to the reference acts, relaxed on the positives of mixed groups
        assert m["kl/mean"] > 0 and m["apo/kl_weight_mean"] < 1.0
    if method == "rpg":  # 2 epochs x 4 mini-batches (2 groups: whole groups per mini-batch), ratios off 1
        assert m["train/optimizer_steps"] >= 4 and (m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0)
    if method == "egsw":  # the softmax weights leave 1
        assert m["egsw/weight_max"] > 1.0
    if method == "gtpo":  # per-token credit inside a completion
        assert m["advantage/within_row_std"] > 0 and m["gtpo/shaping_abs"] > 0
    if method == "grpo_s":
        assert m["grpo_s/shaping_abs"] > 0
    if method in ("repo", "remix"):  # replay fires once prompts recur (tests/algorithms/test_replay.py)
        assert "replay/rows" in m


def test_overlong_masking_stage_in_a_run(tiny_cfg):
    stage = "{_target_:rlexp.algorithms.group_stages.filters.overlong_mask,_partial_:true}"
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=dapo", f"algorithm.group_stages=[{stage}]"))
    m = result.metrics
    assert m["overlong/masked_frac"] == pytest.approx(m["length/truncated_frac"])
    if m["overlong/masked_frac"] == 1.0:  # every completion hit the limit: nothing left in the loss
        assert m["loss/total"] == 0.0


def test_ratio_methods_take_their_schedule_on_tiny(tiny_cfg):
    """A ratio method's own config gives k optimiser steps per rollout (capped at the step's groups); the
    ratio leaves 1 after the first (trainer.prompts_per_step is 2 in the tiny config: 2 steps)."""
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=gspo"))
    m = result.metrics
    assert m["train/optimizer_steps"] == 2.0
    assert m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0
    assert "mismatch/kl" in m and m["mismatch/kl"] >= 0


def test_rollout_correction_runs_and_reports(tiny_cfg):
    result = run(tiny_cfg(*VARYING, *FAST, "trainer.rollout_correction=token_truncate"))
    m = result.metrics
    assert 0.0 <= m["rollout_correction/affected_frac"] <= 1.0 and m["rollout_correction/weight_mean"] > 0
