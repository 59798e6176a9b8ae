"""The bilingual dictionary tool (rlexp/tools/dictionary.py), run for real on the shipped Spanish-English sample and
on hand-written files: lookups (exact entries first, then entries containing the word; case, accents and
punctuation ignored), an unknown word, malformed calls, the file schemas, and the tool inside a tool-use episode in
the tag format."""

from __future__ import annotations

import json

import pytest

from rlexp.environments.tool_use import ToolUse
from rlexp.tools.dictionary import DictionaryTool, load_entries, normalise


@pytest.fixture(scope="module")
def sample():
    return DictionaryTool()  # pkg:rlexp/tools/data/dictionary_es_en.tsv


def test_a_word_comes_back_with_its_entries_exact_ones_first(sample):
    # "casa": its own entry, then the phrase that contains it as a whole word
    res = sample({"word": "casa"})
    assert not res.error and res.text == "<matches>\ncasa = house\ncasa de campo = country house\n</matches>"
    assert sample({"word": "grande"}).text == "<matches>\ngrande = big\ngrande = large\n</matches>"  # every sense
    assert sample({"word": "  Casa. "}).text == res.text  # case, spaces and the punctuation around it ignored
    assert sample({"word": "cancion"}).text == "<matches>\ncanción = song\n</matches>"  # accents ignored
    assert sample({"word": "¿río?"}).text == "<matches>\nrío = river\n</matches>"
    assert sample.lookup("cas") == []  # not a whole word of any entry


def test_an_unknown_word_is_an_answer_and_a_malformed_call_an_error(sample):
    unknown = sample({"word": "xyz"})
    assert not unknown.error and unknown.text == "<matches>\nno entry for 'xyz'\n</matches>"
    for args in ({}, {"word": ""}, {"word": " ?! "}, {"word": 3}, {"words": "casa"}):
        bad = sample(args)
        assert bad.error and bad.text == "dictionary: needs a non-empty string argument `word`", args
    assert sample({"word": "a" * 101}).error  # longer than max_query_chars


def test_at_most_max_matches_entries(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("source\ttarget\n" + "".join(f"sol\tsun {i}\n" for i in range(7)) + "sol y luna\tsun and moon\n")
    tool = DictionaryTool(str(path), max_matches=5)
    assert tool({"word": "sol"}).text.splitlines()[1:-1] == [f"sol = sun {i}" for i in range(5)]
    assert DictionaryTool(str(path), max_matches=8).lookup("sol")[-1] == ("sol y luna", "sun and moon")
    both = DictionaryTool(str(path), search="both")
    assert both.lookup("moon") == [("sol y luna", "sun and moon")] and DictionaryTool(str(path)).lookup("moon") == []


def test_the_file_schemas(tmp_path):
    tsv = tmp_path / "d.tsv"
    tsv.write_text("# a comment\nnote\ttarget\tsource\n\nn1\thouse\tcasa\n")  # columns in any order, extra ones
    assert load_entries(str(tsv)) == [("casa", "house")]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"source": "perro", "target": "dog"}\n\n{"source": "gato", "target": "cat"}\n')
    assert load_entries(str(jsonl)) == [("perro", "dog"), ("gato", "cat")]
    listed = tmp_path / "l.json"
    listed.write_text(json.dumps([{"source": "sol", "target": "sun"}]))
    assert load_entries(str(listed)) == [("sol", "sun")]
    mapping = tmp_path / "m.json"
    mapping.write_text(json.dumps({"grande": ["big", "large"], "sol": "sun"}))
    assert load_entries(str(mapping)) == [("grande", "big"), ("grande", "large"), ("sol", "sun")]


def test_malformed_files_and_settings_are_refused_naming_them(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("word\tmeaning\ncasa\thouse\n")
    with pytest.raises(ValueError, match=r"bad.tsv line 1: the header must name the columns source and target"):
        load_entries(str(bad))
    bad.write_text("source\ttarget\ncasa\n")
    with pytest.raises(ValueError, match=r"bad.tsv line 2: an entry needs a source and a target"):
        load_entries(str(bad))
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"source": "casa", "target": "house"}\n{"source": 1}\n')
    with pytest.raises(ValueError, match=r"b.jsonl line 2: an entry needs non-empty string fields"):
        load_entries(str(broken))
    with pytest.raises(FileNotFoundError, match="tools.dictionary.path"):
        load_entries(str(tmp_path / "missing.tsv"))
    with pytest.raises(ValueError, match="unsupported dictionary file type '.txt'"):
        (tmp_path / "d.txt").write_text("x")
        load_entries(str(tmp_path / "d.txt"))
    with pytest.raises(ValueError, match="tools.dictionary.max_matches"):
        DictionaryTool(max_matches=0)
    with pytest.raises(ValueError, match="tools.dictionary.search"):
        DictionaryTool(search="gloss")


def test_normalise():
    assert normalise("  ¡Canción,  Triste! ") == "cancion, triste"
    assert normalise("NIÑO") == "nino"


def test_lookups_in_a_tool_use_episode_with_tags(sample):
    ep = ToolUse([sample], call_format="tags")({})
    step = ep.step("<dictionary>perro</dictionary> <dictionary>xyz</dictionary>")
    assert step.observation == "<matches>\nperro = dog\n</matches>\n<matches>\nno entry for 'xyz'\n</matches>"
    assert step.info == {"tool_calls": 2, "tool_errors": 0, "malformed_calls": 0}
    cut = ep.step("<dictionary>perro")  # an unterminated tag: a counted error, returned to the model
    assert cut.info["tool_errors"] == 1 and "unterminated <dictionary>" in cut.observation
    assert ep.step("<answer>The dog.</answer>").done  # no call: the final answer
