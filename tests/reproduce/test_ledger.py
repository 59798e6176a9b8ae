"""Acceptance 3 of issue 27: the claims ledger in results/README.md matches the experiment files (and the verdicts
in results/<experiment>/reproduce.json); regenerate it with `rlexp reproduce --update-ledger`."""

from __future__ import annotations

import json
from pathlib import Path

from rlexp.reproduce import ledger
from rlexp.reproduce.spec import all_specs, load_spec

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_the_ledger_matches_the_experiment_files():
    specs = all_specs()
    section = ledger.current(RESULTS / "README.md")
    assert section is not None, "results/README.md has no claims ledger markers"
    assert section == ledger.render(specs, RESULTS), (
        "the claims ledger of results/README.md is out of date: run `rlexp reproduce --update-ledger`"
    )
    listed = {name for name, spec in specs.items() if not spec.demo}
    assert len(listed) >= 4 and all(f"| `{name}` (" in section for name in listed)
    assert "reproduce_tiny_demo" not in section


def test_a_row_says_not_run_yet_then_the_verdict(tmp_path):
    spec = load_spec("dapo_vs_grpo_smollm2")
    (row,) = ledger.rows({spec.name: spec}, tmp_path)
    assert row[0] == "`dapo_vs_grpo_smollm2` (grpo vs dapo)" and row[4] == "not run yet"
    assert row[3].startswith("cpu: SmolLM2-135M") and row[5] == "`rlexp reproduce dapo_vs_grpo_smollm2`"
    (tmp_path / spec.name).mkdir()
    state = {"scale": "gpu", "scale_note": None, "verdict": "not testable at this scale", "why": "needs a | b"}
    (tmp_path / spec.name / "reproduce.json").write_text(json.dumps(state))
    (row,) = ledger.rows({spec.name: spec}, tmp_path)
    assert row[3].startswith("gpu: SmolLM2-135M") and row[4] == "not testable at this scale: needs a \\| b"
    assert row[5] == "[dapo_vs_grpo_smollm2/](dapo_vs_grpo_smollm2/README.md)"


def test_update_rewrites_only_the_section(tmp_path):
    spec = load_spec("dapo_vs_grpo_smollm2")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Results\n\nintro\n\n{ledger.BEGIN}\nOLD ROW\n{ledger.END}\n\n## more\n")
    assert ledger.update(readme, {spec.name: spec})
    text = readme.read_text()
    assert text.startswith("# Results\n\nintro\n\n") and text.endswith("\n\n## more\n") and "OLD ROW" not in text
    assert not ledger.update(readme, {spec.name: spec})  # already current
    bare = tmp_path / "bare.md"
    bare.write_text("# Results\n")
    assert ledger.update(bare, {spec.name: spec}) and ledger.current(bare) == ledger.render({spec.name: spec}, tmp_path)
