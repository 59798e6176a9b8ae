"""A resolved config as flat tracker parameters (a.b.c keys, scalars or JSON)."""

from __future__ import annotations

import json


def flatten(d, prefix="") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, (int, float, bool, str)) or v is None else json.dumps(v)
    return out
