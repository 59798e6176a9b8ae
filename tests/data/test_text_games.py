"""TextWorld games as a dataset (rlexp/data/text_games.py): games made by TextWorld's own generator into a cache
folder keyed by the settings, one record per game (the opening as the question, the walkthrough as the answer, the
game file and max score in the metadata), read back from the cache afterwards."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("textworld")

from rlexp.data.text_games import clean_text, game_folder, textworld_games  # noqa: E402
from tests.environments.text_game_cache import cache_dir, games  # noqa: E402


@pytest.mark.long  # TextWorld generates the games (~6 s): the long suite
def test_records_are_the_generated_games():
    data = games(level=1)  # 3 games: 2 train, 1 held out (made once per session, ~5 s)
    records = data.train + data.eval
    assert len(data.train) == 2 and len(data.eval) == 1 and data.name == "textworld"
    for r in records:
        meta = r["metadata"]
        assert Path(meta["game"]).is_file() and meta["game"].endswith(".z8")
        assert Path(meta["game"]).name.startswith("tw-")  # Jericho fully supports TextWorld games only so named
        assert meta["max_score"] == 1.0 and meta["walkthrough"] == ["take coin"] and r["answer"] == "take coin"
        assert r["scorer"] == "textworld" and "coin" in r["question"]
        assert "-= " in r["question"]  # the first room's title, e.g. "-= Studio =-"
        assert r["question"].endswith("Available commands: examine coin, inventory, look, take coin")
        assert "$$" not in r["question"]  # the ASCII-art banner is left out
    assert len({r["question"] for r in records}) == 3
    folder = game_folder("tw-coin_collector", {"level": 1}, 0, cache_dir())
    assert Path(records[0]["metadata"]["game"]).parent == folder


@pytest.mark.long
def test_the_cache_is_read_back_and_keyed_by_settings():
    games(level=1)
    t = time.perf_counter()
    again = textworld_games(seed=0, settings={"level": 1}, train_size=2, eval_size=1, cache_dir=cache_dir())
    assert time.perf_counter() - t < 1.0  # nothing made again
    no_commands = textworld_games(
        seed=0, settings={"level": 1}, train_size=2, eval_size=1, show_commands=False, cache_dir=cache_dir()
    )
    assert [r["metadata"]["game"] for r in no_commands.train] == [r["metadata"]["game"] for r in again.train]
    assert all("Available commands" not in r["question"] for r in no_commands.train)
    assert game_folder("tw-coin_collector", {"level": 2}, 0, cache_dir()) != game_folder(
        "tw-coin_collector", {"level": 1}, 0, cache_dir()
    )
    assert game_folder("tw-coin_collector", {"level": 1}, 1, cache_dir()) != game_folder(
        "tw-coin_collector", {"level": 1}, 0, cache_dir()
    )


def test_bad_settings_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="dataset.challenge='tw-nope'"):
        textworld_games(seed=0, challenge="tw-nope", train_size=1, eval_size=1, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="dataset.settings"):
        textworld_games(seed=0, settings={"level": 0}, train_size=1, eval_size=1, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="dataset.train_size"):
        textworld_games(seed=0, train_size=0, eval_size=1, cache_dir=str(tmp_path))


def test_clean_text_collapses_blank_lines():
    assert (
        clean_text("\n\n-= Attic =-\nAn attic.\n\n\n\n\nThere is a coin.\n\n")
        == "-= Attic =-\nAn attic.\n\nThere is a coin."
    )
