"""Preference sets in their real schemas (tests/fixtures/data: UltraFeedback-binarized, HH-RLHF, KTO's unpaired
rows), read by rlexp.preference.data; the hub entries compose."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.config.schema import ConfigError
from rlexp.preference.data import preference_dataset, split_prompt

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"


def test_ultrafeedback_messages_split_into_prompt_and_replies():
    data = preference_dataset(seed=0, path=str(FIXTURES / "ultrafeedback_binarized_sample.jsonl"), eval_size=2)
    assert (len(data.train), len(data.eval)) == (6, 2)
    row = next(r for r in data.train + data.eval if "12 + 7" in r["prompt"][0]["content"])
    assert row["prompt"] == [{"role": "user", "content": "What is 12 + 7?"}]
    assert row["chosen"] == [{"role": "assistant", "content": "12 + 7 = 19.\n#### 19"}]
    assert row["rejected"] == [{"role": "assistant", "content": "12 + 7 = 21.\n#### 21"}]


def test_hh_rlhf_text_splits_after_the_last_assistant_turn():
    data = preference_dataset(
        seed=0,
        path=str(FIXTURES / "hh_rlhf_sample.jsonl"),
        columns={"chosen": "chosen", "rejected": "rejected"},
        eval_size=2,
    )
    row = next(r for r in data.train + data.eval if "12 + 7" in r["prompt"])
    assert row["prompt"].endswith("\n\nHuman: What is 12 + 7?\n\nAssistant:")
    assert row["prompt"].startswith("\n\nHuman: Hi, can you help me?\n\nAssistant: Of course.")  # multi-turn kept
    assert (row["chosen"], row["rejected"]) == (" 12 + 7 = 19.\n#### 19", " 12 + 7 = 21.\n#### 21")
    # without an Assistant marker: the common prefix (TRL's extract_prompt)
    assert split_prompt("Q: 1+1? A: 2", "Q: 1+1? A: 3") == ("Q: 1+1? A:", " 2", " 3")


def test_pairs_unpair_for_kto_and_unpaired_rows_cannot_pair():
    data = preference_dataset(seed=0, path=str(FIXTURES / "ultrafeedback_binarized_sample.jsonl"), eval_size=2)
    rows = data.rows("unpaired")
    assert len(rows) == 12 and [r["label"] for r in rows[:2]] == [True, False]
    unpaired = preference_dataset(
        seed=0,
        path=str(FIXTURES / "kto_unpaired_sample.jsonl"),
        schema="unpaired",
        columns={"prompt": "prompt", "completion": "completion", "label": "label"},
        eval_size=4,
    )
    assert len(unpaired.train) == 12 and {r["label"] for r in unpaired.train} == {True, False}
    assert unpaired.rows("prompts")  # the distinct prompts
    with pytest.raises(ConfigError, match="unpaired"):
        unpaired.rows("paired")


def test_bad_columns_and_missing_data_name_the_key():
    with pytest.raises(ConfigError, match="dataset.columns.chosen='winner'"):
        preference_dataset(
            seed=0,
            path=str(FIXTURES / "ultrafeedback_binarized_sample.jsonl"),
            columns={"chosen": "winner", "rejected": "rejected"},
        )
    with pytest.raises(ConfigError, match="dataset.path"):
        preference_dataset(seed=0)
    with pytest.raises(ConfigError, match="dataset.schema"):
        preference_dataset(seed=0, schema="triples", path="x.jsonl")


HUB = [("ultrafeedback", "HuggingFaceH4/ultrafeedback_binarized"), ("hh_rlhf", "Anthropic/hh-rlhf")]


@pytest.mark.parametrize("entry,hub", HUB)
def test_hub_entries_compose(tiny_cfg, entry, hub):
    cfg = tiny_cfg("algorithm=dpo", f"dataset={entry}")
    node = OmegaConf.to_container(cfg.dataset, resolve=True)
    assert node["hub"]["path"] == hub and node["_target_"] == "rlexp.preference.data.preference_dataset"
