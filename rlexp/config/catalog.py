"""What each config group offers (``rlexp list [group]``).

``rlexp list`` prints the groups (folders of ``conf/``) with their entry counts; ``rlexp list <group>``
(singular or plural: ``algorithm``/``algorithms``) prints one line per entry. Algorithms show their
``paper`` and one-line ``mechanism`` fields; other groups show ``name``/``paper``/``description``
fields when present, else the first line of the file's header comment. Files are read as YAML
without resolving interpolations, so listing never loads a model or a dataset.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR as CONF_PATH

CONF_DIR = Path(CONF_PATH)


# folders of conf/ that hold files for other tools, not Hydra group options (accelerate's launcher configs)
NOT_GROUPS = ("accelerate",)


def groups(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(
        p.name
        for p in conf_dir.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and p.name not in NOT_GROUPS
    )


def resolve_group(name: str, conf_dir: Path = CONF_DIR) -> str:
    """Folder name for ``name`` (accepts plurals: algorithms → algorithm, rewards → reward)."""
    known = groups(conf_dir)
    for candidate in (name, name[:-1] if name.endswith("s") else None, name[:-2] if name.endswith("es") else None):
        if candidate and candidate in known:
            return candidate
    raise KeyError(f"unknown config group {name!r}; groups: {', '.join(known)}")


def header_lines(path: Path) -> list[str]:
    """The leading comment block, without the ``#`` markers (``# @package`` lines skipped)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        out.append(text)
    return out


def _field(cfg, key: str) -> str:
    try:
        value = cfg.get(key) if hasattr(cfg, "get") else None
    except Exception:  # an interpolation that cannot resolve outside the app
        value = OmegaConf.to_container(cfg, resolve=False).get(key)
    return "" if value is None else str(value)


def entry(path: Path) -> dict[str, str]:
    """name, paper, mechanism/description and the header's first line of one config file."""
    header = header_lines(path)
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # a broken file is listed with its error rather than hiding the rest
        return {
            "entry": path.stem,
            "name": path.stem,
            "paper": "",
            "family": "",
            "mechanism": f"(unreadable: {e})",
            "summary": header[0] if header else "",
        }
    mechanism = _field(cfg, "mechanism") or _field(cfg, "description")
    if not mechanism and len(header) > 1:
        mechanism = header[1]
    return {
        "entry": path.stem,
        "name": _field(cfg, "name") or path.stem,
        "paper": _field(cfg, "paper"),
        "family": _field(cfg, "family"),
        "mechanism": mechanism,
        "summary": header[0] if header else "",
    }


def list_group(group: str, conf_dir: Path = CONF_DIR) -> list[dict[str, str]]:
    folder = conf_dir / resolve_group(group, conf_dir)
    return [entry(p) for p in sorted(folder.glob("*.yaml"))]


def format_group(group: str, conf_dir: Path = CONF_DIR) -> str:
    name = resolve_group(group, conf_dir)
    rows = list_group(name, conf_dir)
    width = max((len(r["entry"]) for r in rows), default=0)
    lines = [f"{name} ({len(rows)} entries; pick one with `{name}=<entry>`)"]
    for r in rows:
        if name == "algorithm" or r["paper"]:
            family = f"[{r['family']}] " if r["family"] else ""
            lines.append(f"  {r['entry']:<{width}}  {family}{r['paper'] or r['summary']}")
            if r["mechanism"]:
                lines.append(f"  {'':<{width}}    {r['mechanism']}")
        else:
            lines.append(f"  {r['entry']:<{width}}  {r['summary'] or r['mechanism'] or r['name']}")
    return "\n".join(lines)


def format_groups(conf_dir: Path = CONF_DIR) -> str:
    lines = ["config groups (`rlexp list <group>` for the entries; `rlexp list parts`, `rlexp list papers`):"]
    for g in groups(conf_dir):
        n = len(list((conf_dir / g).glob("*.yaml")))
        lines.append(f"  {g:<12} {n} entries")
    return "\n".join(lines)
