"""``rlexp list [group ...]``: the config groups, one group's entries (``rlexp list algorithms``), the
registered parts by kind and family (``rlexp list parts [kind]``), or the paper registry
(``rlexp list papers [--json] [--status S] [--family F]``)."""

from __future__ import annotations

import sys

from rlexp.config.catalog import format_group, format_groups


def format_parts(kinds: list[str] | None = None) -> str:
    """Every registry (or the named kinds): one line per part, grouped by family, with its ``_target_``."""
    from rlexp.core.registry import load_all

    registries = load_all()

    def kind(name: str) -> str:
        for k in registries:
            if name in (k, f"{k}s", f"{k}es"):
                return k
        raise KeyError(f"unknown part kind {name!r}; kinds: {', '.join(registries)}")

    wanted = [registries[kind(k)] for k in kinds] if kinds else list(registries.values())
    lines = []
    for reg in wanted:
        lines.append(f"{reg.kind} ({len(reg)} parts): {reg.signature}")
        family = None
        for part in reg.parts():
            if part.family != family:
                family = part.family
                lines.append(f"  {family}")
            lines.append(f"    {part.name:<24} {part.target}")
            if part.summary:
                lines.append(f"    {'':<24} {part.summary}")
        lines.append("")
    return "\n".join(lines).rstrip()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(format_groups())
        return
    if argv[0] == "papers":
        from rlexp.papers import main as papers_main

        papers_main(argv[1:])
        return
    if argv[0] == "parts":
        try:
            print(format_parts(argv[1:]))
        except KeyError as e:
            print(f"rlexp list: {e.args[0]}", file=sys.stderr)
            sys.exit(2)
        return
    status = 0
    for i, name in enumerate(argv):
        try:
            text = format_group(name)
        except KeyError as e:
            print(f"rlexp list: {e.args[0]}", file=sys.stderr)
            status = 2
            continue
        print(("\n" if i else "") + text)
    if status:
        sys.exit(status)
