"""The paper registry: it loads, rejects malformed entries by id and key, names configs that compose, covers
every algorithm config and every grade-A catalogue row, and its views filter."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from rlexp.algorithms.families import FAMILIES
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import register
from rlexp.papers import STATUSES, Paper, filter_papers, format_papers, load_papers, main, papers_json

REPO = Path(__file__).resolve().parents[2]
CATALOGUES = REPO / ".." / "shared" / "papers"
PAPERS = load_papers()
CONFIGS = sorted({c for p in PAPERS for c in p.configs})

GOOD = {
    "id": "toy_po",
    "title": "Toy Policy Optimization",
    "year": 2025,
    "arxiv": None,
    "catalogue": "catalog_0 #1",
    "family": "group-baseline",
    "status": "implemented",
    "note": None,
    "issue": None,
    "configs": ["algorithm/grpo"],
}


def _write(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(entries, sort_keys=False, allow_unicode=True))
    return path


# ---------------------------------------------------------------- the registry itself


def test_registry_loads_with_unique_ids_sorted_by_family_then_id():
    assert len(PAPERS) > 100
    assert len({p.id for p in PAPERS}) == len(PAPERS)
    order = list(FAMILIES)
    keys = [(order.index(p.family), p.id) for p in PAPERS]
    assert keys == sorted(keys)
    assert {p.status for p in PAPERS} <= set(STATUSES)


def test_good_entry_loads(tmp_path):
    (paper,) = load_papers(_write(tmp_path, [GOOD]))
    assert paper == Paper(
        "toy_po",
        "Toy Policy Optimization",
        2025,
        None,
        "catalog_0 #1",
        "group-baseline",
        "implemented",
        None,
        None,
        ("algorithm/grpo",),
    )
    assert paper.refs == ("catalog_0 #1",)


def _without(key):
    return {k: v for k, v in GOOD.items() if k != key}


BAD = [
    ("missing key", _without("note"), "'toy_po'", "note"),
    ("unknown key", {**GOOD, "url": "https://example.org"}, "'toy_po'", "url"),
    ("status", {**GOOD, "status": "done"}, "'toy_po'", "status"),
    ("family", {**GOOD, "family": "misc"}, "'toy_po'", "family"),
    ("partial without note", {**GOOD, "status": "partial"}, "'toy_po'", "note"),
    ("planned without note", {**GOOD, "status": "planned", "issue": 20, "configs": []}, "'toy_po'", "note"),
    ("out of scope without note", {**GOOD, "status": "out of scope", "note": " ", "configs": []}, "'toy_po'", "note"),
    ("implemented without configs", {**GOOD, "configs": []}, "'toy_po'", "configs"),
    ("partial without configs", {**GOOD, "status": "partial", "note": "x", "configs": []}, "'toy_po'", "configs"),
    ("config not group/name", {**GOOD, "configs": ["grpo"]}, "'toy_po'", "configs"),
    ("config file missing", {**GOOD, "configs": ["algorithm/no_such_method"]}, "'toy_po'", "configs"),
    ("arxiv as a float", {**GOOD, "arxiv": 2402.033}, "'toy_po'", "arxiv"),
    ("catalogue ref", {**GOOD, "catalogue": "catalogue zero, row 1"}, "'toy_po'", "catalogue"),
    ("planned without issue", {**GOOD, "status": "planned", "note": "soon", "configs": []}, "'toy_po'", "issue"),
    ("no id", _without("id"), "#0", "id"),
]


@pytest.mark.parametrize("entry,where,key", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_entry_names_id_and_key(tmp_path, entry, where, key):
    with pytest.raises(ValueError, match=rf"entry {re.escape(where)}, key '{key}'"):
        load_papers(_write(tmp_path, [entry]))


def test_duplicate_id_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"entry 'toy_po', key 'id': duplicate"):
        load_papers(_write(tmp_path, [GOOD, {**GOOD, "title": "Another"}]))


def test_second_entry_is_named_by_index_when_it_has_no_id(tmp_path):
    with pytest.raises(ValueError, match=r"entry #1, key 'id'"):
        load_papers(_write(tmp_path, [GOOD, _without("id")]))


# ---------------------------------------------------------------- configs


@pytest.fixture(scope="module", autouse=True)
def _schema():
    register()


@pytest.mark.parametrize("config", CONFIGS)
def test_named_config_composes(config):
    group, name = config.split("/", 1)
    override = f"+{group}={name}" if group == "experiment" else f"{group}={name}"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[override, "model=tiny"])
    if group == "algorithm":
        assert cfg.algorithm.name == name
        instantiate(cfg.algorithm, _convert_="all")


def test_every_algorithm_config_is_named_by_a_paper():
    shipped = {f"algorithm/{p.stem}" for p in (Path(CONF_DIR) / "algorithm").glob("*.yaml")}
    assert shipped and not shipped - set(CONFIGS), sorted(shipped - set(CONFIGS))


def test_algorithm_config_family_matches_a_paper_naming_it():
    """Where a method config declares its family, a paper that names the config is in that family."""
    for path in sorted((Path(CONF_DIR) / "algorithm").glob("*.yaml")):
        family = (yaml.safe_load(path.read_text()) or {}).get("family")
        if family is None:
            continue
        config = f"algorithm/{path.stem}"
        families = {p.family for p in PAPERS if config in p.configs}
        assert family in families, f"{config} declares family {family!r}; its papers are in {sorted(families)}"


# ---------------------------------------------------------------- catalogues


def grade_a_rows(folder: Path) -> list[str]:
    """``"catalog_N #row"`` of every row whose Impl. cell starts with A (A/B included), in the catalogue tables."""
    refs = []
    for path in sorted(folder.glob("catalog_*.md")):
        in_table = False
        for line in path.read_text().splitlines():
            if not line.startswith("|"):
                in_table = False
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[-1].strip("* ").lower() == "impl.":
                in_table = True
            elif in_table and cells[0].isdigit() and cells[-1].lstrip("* ").startswith("A"):
                refs.append(f"{path.stem} #{cells[0]}")
    return refs


@pytest.mark.skipif(not CATALOGUES.is_dir(), reason="../shared/papers is not in this checkout")
def test_every_grade_a_row_appears_exactly_once():
    rows = grade_a_rows(CATALOGUES)
    refs = [r for p in PAPERS for r in p.refs]
    counts = Counter(refs)
    assert len(rows) == len(set(rows)) > 100
    assert len(refs) == len(rows)
    assert not [r for r, n in counts.items() if n > 1], "a catalogue row in two entries"
    assert set(refs) == set(rows), (sorted(set(rows) - set(refs)), sorted(set(refs) - set(rows)))
    # several rows of one paper share an entry, so there are at most as many catalogued entries as rows
    assert sum(1 for p in PAPERS if p.catalogue) <= len(rows)


# ---------------------------------------------------------------- views


def test_json_view_parses_and_filters():
    everything = json.loads(papers_json(PAPERS))
    assert [e["id"] for e in everything] == [p.id for p in PAPERS]
    assert set(everything[0]) == set(GOOD)
    partial = json.loads(papers_json(PAPERS, status="partial"))
    assert partial and {e["status"] for e in partial} == {"partial"}
    consistency = json.loads(papers_json(PAPERS, family="consistency"))
    assert consistency and {e["family"] for e in consistency} == {"consistency"}
    both = json.loads(papers_json(PAPERS, status="implemented", family="consistency"))
    assert {e["id"] for e in both} == {p.id for p in filter_papers(PAPERS, "implemented", "consistency")}


def test_table_ends_with_counts_per_status():
    lines = format_papers(PAPERS).splitlines()
    counts = Counter(p.status for p in PAPERS)
    assert lines[-1] == f"{len(PAPERS)} papers: " + " · ".join(f"{s} {counts[s]}" for s in STATUSES)
    assert all(p.id in "\n".join(lines) for p in PAPERS)


def test_main_prints_table_and_json(capsys):
    main(["--status", "out-of-scope"])
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].endswith("out of scope " + str(len(filter_papers(PAPERS, "out of scope"))))
    main(["--json", "--family", "entropy"])
    assert {e["family"] for e in json.loads(capsys.readouterr().out)} == {"entropy"}


@pytest.mark.parametrize("args,valid", [(["--status", "done"], "planned"), (["--family", "misc"], "clip-ratio")])
def test_main_rejects_unknown_filters_with_exit_2(capsys, args, valid):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert valid in capsys.readouterr().err
