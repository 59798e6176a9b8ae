"""The README's code map names every package of the tree, and only those."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def packages() -> set[str]:
    out = set()
    for init in (REPO / "rlexp").rglob("*.py"):
        if "__pycache__" in init.parts or "conf" in init.relative_to(REPO / "rlexp").parts:
            continue
        if init.parent != REPO / "rlexp":
            out.add(init.parent.relative_to(REPO).as_posix() + "/")
    return out


def code_map() -> set[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Code map") :]
    section = section[: section.index("\n## ", 3)]
    return set(re.findall(r"^\| `(rlexp/[\w/]+/)` \|", section, re.M))


def test_code_map_matches_the_tree():
    listed, present = code_map(), packages()
    assert present - listed == set(), "packages missing from the README's code map"
    assert listed - present - {"rlexp/conf/"} == set(), "code map rows without a package"
    assert (REPO / "rlexp" / "conf" / "config.yaml").is_file()


def test_top_level_conf_is_the_package_tree_not_a_copy():
    conf = REPO / "conf"
    assert conf.is_symlink() and conf.resolve() == (REPO / "rlexp" / "conf").resolve()
