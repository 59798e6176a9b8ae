"""Training sets read through a column mapping: one loader for any hub dataset or local file, and one entry for
every reasoning-gym task (and weighted mixtures of them).

``mapped_dataset`` (the ``dataset=`` entries ``math_train``, ``dapo_math``, ``deepscaler``, ``big_math``,
``openr1_math``, ``skywork_or1_math``/``_code``, ``orz_math``, ``numinamath_cot``, ``limr``, ``eurus2_math``/``_code``,
``mbpp_train``, ``countdown_tinyzero``, ``knights_knaves_logicrl``, ``gsm8k``) reads its rows from

* ``dataset.path``: a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file in the set's own schema (first
  choice when set: offline, this is how a hub set is used);
* ``dataset.hub``: ``{path, subset, split, revision}`` for ``datasets.load_dataset`` (``subset`` or ``split`` may be a
  list, concatenated: MATH's seven subjects, Knights-and-Knaves' 3ppl..7ppl);
* ``dataset.url``: a file downloaded once into ``~/.cache/rlexp/datasets`` (Open-Reasoner-Zero's json on GitHub),

and turns each row into the record of ``rlexp.data.sources``::

    {"id", "question", "answer", "scorer", "metadata": {"source", "row", "solution"?, ...}, "tests"?}

The mapping language
--------------------
``dataset.columns`` maps a record field — ``question``, ``answer``, ``solution``, ``tests``, ``options``, ``id`` — to
a *spec*; ``dataset.metadata`` maps extra names (kept in ``record["metadata"]``) to specs. A spec is

* a *path* string: where the value is in the row —
  ``problem`` (a column), ``reward_model.ground_truth`` (a field of a struct column), ``prompt[-1].content`` or
  ``0.value`` (a list item by index), ``prompt[role=user].content`` (the *last* item of a list of dicts whose
  ``role`` is ``user``: verl's and TRL's chat-message lists). A column whose own name contains dots (a flattened
  export) is found first;
* ``{path: <path>, rules: [...], default: <value>}``: the value transformed by the rules in order; ``default`` is
  used when the path is absent or null;
* ``{template: "Using the numbers {nums}, reach {target}."}``: text built from paths (a string as is, any other value
  as JSON; ``{test_list|lines}`` puts a list's items one per line);
* ``{value: <constant>}``.

Rules: ``last_boxed`` (the content of the last ``\\boxed{…}``/``\\fbox{…}``: answers of solution-only sets such as
MATH and NuminaMath), ``after_hash`` (the text after the last ``####``, thousands separators removed: GSM8K),
``json`` (parse a JSON — or Python-literal — string: ground truths stored as text), ``first`` (the first item of a
list), ``strip``, ``{remove_prefix: s}`` / ``{remove_suffix: s}`` (a fixed instruction the set bakes into its
prompt, removed when present), ``{regex: pattern}`` (group 1 — or the whole match — of the last match).

Checks: the question must be text, the answer text or a number (``rlexp.data.sources.text_value``), ``tests`` a
non-empty value (scorer ``code``: the tests are kept as ``record["tests"]`` for the code reward), ``options`` a list
of at least two texts (the question is then rendered with lettered options, the answer becomes the letter and the
scorer ``choice``: ``rlexp.data.multiple_choice``). A row that fails is refused in one line naming the file and the
row (``line`` for jsonl) and the column or path; ``invalid_rows: skip`` drops such rows instead and logs how many
(sets known to hold a few unusable rows: NuminaMath solutions without ``\\boxed``, DeepScaleR's rows without an
answer). ``where`` / ``exclude`` (``{path: value or [values]}``) keep or drop rows by a field's value (the math or
the code half of a mixed set); ``max_rows`` reads only the first rows (a quick run on a 860k-row set).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlexp.data.reasoning_gym_compat import import_reasoning_gym
from rlexp.data.sources import (
    DatasetSplits,
    _jsonable,
    _split,
    load_table,
    package_file,
    parse_gsm8k_answer,
    read_jsonl,
    text_value,
)

log = logging.getLogger(__name__)

FIELDS = ("question", "answer", "solution", "tests", "options", "id")
SCORERS = ("math", "exact", "reasoning_gym", "code", "choice")
INVALID_ROWS = ("error", "skip")
RESERVED_METADATA = ("source", "row", "line", "solution", "tests_format", "options", "letters", "correct")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_UNSET = object()


def _config_error(message: str):
    from rlexp.config.schema import ConfigError

    return ConfigError(message)


class RowError(ValueError):
    """A row that does not fit the mapping (the message names the row, the field and the path)."""


# ----------------------------------------------------------------------------------------------------------- paths


def parse_path(text: str, key: str) -> tuple:
    """``reward_model.ground_truth`` / ``prompt[-1].content`` / ``prompt[role=user].content`` -> tokens
    ``("key", name)``, ``("index", i)``, ``("match", field, value)``; a bad path is a ConfigError naming ``key``."""
    if not isinstance(text, str) or not text.strip():
        raise _config_error(f"{key}: a path must be a non-empty string, got {text!r}")
    tokens: list[tuple] = []
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch == ".":
            pos += 1
            continue
        if ch == "[":
            end = text.find("]", pos)
            if end < 0:
                raise _config_error(f"{key}: path {text!r} has an unclosed '['")
            inner = text[pos + 1 : end].strip()
            if re.fullmatch(r"-?\d+", inner):
                tokens.append(("index", int(inner)))
            elif "=" in inner:
                name, value = (s.strip() for s in inner.split("=", 1))
                if not name:
                    raise _config_error(f"{key}: path {text!r}: '[{inner}]' needs a field name before '='")
                tokens.append(("match", name, value))
            else:
                raise _config_error(
                    f"{key}: path {text!r}: '[{inner}]' is neither an index ([0], [-1]) nor a match ([role=user])"
                )
            pos = end + 1
            continue
        m = re.match(r"[^.\[\]]+", text[pos:])
        if m is None:  # a stray ']'
            raise _config_error(f"{key}: path {text!r} has an unmatched ']'")
        tokens.append(("key", m.group(0)))
        pos += len(m.group(0))
    if not tokens:
        raise _config_error(f"{key}: path {text!r} names nothing")
    return tuple(tokens)


class _Missing(Exception):
    pass


def _keys(value) -> str:
    if isinstance(value, Mapping):
        return f"its fields: {sorted(map(str, value))}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"


def resolve(row, path: str, tokens: tuple):
    """The value at ``path`` in ``row``; ``_Missing`` (with what is there instead) when it is not there."""
    if isinstance(row, Mapping) and path in row:  # a flat column named with dots
        return row[path]
    cur, walked = row, ""
    for tok in tokens:
        kind = tok[0]
        if kind == "key":
            name = tok[1]
            if isinstance(cur, Mapping):
                if name not in cur:
                    raise _Missing(f"has no {name!r}" + (f" under {walked!r}" if walked else "") + f" ({_keys(cur)})")
                cur = cur[name]
            elif isinstance(cur, (list, tuple)) and re.fullmatch(r"-?\d+", name):
                cur = _index(cur, int(name), walked)
            else:
                raise _Missing(f"has no {name!r}: {walked or 'the row'!r} is {_keys(cur)}")
            walked = f"{walked}.{name}" if walked else name
        elif kind == "index":
            if not isinstance(cur, (list, tuple)):
                raise _Missing(f"cannot index {walked!r}: it is {_keys(cur)}")
            cur = _index(cur, tok[1], walked)
            walked = f"{walked}[{tok[1]}]"
        else:  # match: the last item whose field equals the value
            _, name, value = tok
            if not isinstance(cur, (list, tuple)):
                raise _Missing(f"cannot select [{name}={value}] in {walked!r}: it is {_keys(cur)}")
            hits = [x for x in cur if isinstance(x, Mapping) and str(x.get(name)) == value]
            if not hits:
                seen = sorted({str(x.get(name)) for x in cur if isinstance(x, Mapping)})
                raise _Missing(f"has no item with {name}={value} in {walked!r} ({name} values: {seen})")
            cur = hits[-1]
            walked = f"{walked}[{name}={value}]"
    return cur


def _index(items, i: int, walked: str):
    if not -len(items) <= i < len(items):
        raise _Missing(f"has no item {i} in {walked or 'the row'!r} (a list of {len(items)})")
    return items[i]


# ----------------------------------------------------------------------------------------------------------- rules


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces; ``\\boxed 5`` too), or None."""
    starts = [(text.rfind(cmd), cmd) for cmd in ("\\boxed", "\\fbox")]
    start, cmd = max(starts)
    if start < 0:
        return None
    i = start + len(cmd)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j].strip() or None
        return None
    m = re.match(r"[^\s$]+", text[i:]) if i > start + len(cmd) else None  # "\boxed 5"
    return m.group(0) if m else None


def _need_text(value, rule: str) -> str:
    if not isinstance(value, str):
        raise RowError(f"is {_keys(value)}, but rule {rule!r} needs text")
    return value


def _rule_last_boxed(value, _):
    found = last_boxed(_need_text(value, "last_boxed"))
    if found is None:
        raise RowError("has no \\boxed{...} answer (rule 'last_boxed')")
    return found


def _rule_after_hash(value, _):
    try:
        return parse_gsm8k_answer(_need_text(value, "after_hash"))
    except ValueError as e:
        raise RowError(f"has no '####' answer (rule 'after_hash'): {e}") from None


def _rule_json(value, _):
    if not isinstance(value, str):
        return value  # already structured (a parquet struct or list)
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise RowError(f"is not JSON or a Python literal ({shown!r}; rule 'json')") from None


def _rule_first(value, _):
    if isinstance(value, (list, tuple)):
        if not value:
            raise RowError("is an empty list (rule 'first')")
        return value[0]
    return value


def _rule_strip(value, _):
    return value.strip() if isinstance(value, str) else value


def _rule_remove_prefix(value, prefix):
    value = _need_text(value, "remove_prefix")
    return value[len(prefix) :] if value.startswith(prefix) else value


def _rule_remove_suffix(value, suffix):
    value = _need_text(value, "remove_suffix")
    return value[: -len(suffix)] if suffix and value.endswith(suffix) else value


def _rule_regex(value, pattern):
    hits = list(pattern.finditer(_need_text(value, "regex")))
    if not hits:
        raise RowError(f"does not match {pattern.pattern!r} (rule 'regex')")
    last = hits[-1]
    return last.group(1) if pattern.groups else last.group(0)


RULES = {
    "last_boxed": _rule_last_boxed,
    "after_hash": _rule_after_hash,
    "json": _rule_json,
    "first": _rule_first,
    "strip": _rule_strip,
    "remove_prefix": _rule_remove_prefix,
    "remove_suffix": _rule_remove_suffix,
    "regex": _rule_regex,
}
_RULES_WITH_ARG = ("remove_prefix", "remove_suffix", "regex")


def _parse_rule(rule, key: str) -> tuple:
    if isinstance(rule, str):
        if rule in _RULES_WITH_ARG:
            raise _config_error(f"{key}: rule {rule!r} needs an argument: {{{rule}: ...}}")
        if rule not in RULES:
            raise _config_error(f"{key}: unknown rule {rule!r}; rules: {', '.join(RULES)}")
        return (rule, None)
    if isinstance(rule, Mapping) and len(rule) == 1:
        name, arg = next(iter(rule.items()))
        if name not in _RULES_WITH_ARG:
            raise _config_error(f"{key}: rule {name!r} takes no argument; rules with one: {', '.join(_RULES_WITH_ARG)}")
        if not isinstance(arg, str):
            raise _config_error(f"{key}: rule {name!r} needs a string argument, got {arg!r}")
        if name == "regex":
            try:
                arg = re.compile(arg, re.S)
            except re.error as e:
                raise _config_error(f"{key}: rule regex {arg!r} does not compile ({e})") from None
        return (name, arg)
    raise _config_error(f"{key}: a rule is a name ({', '.join(RULES)}) or a one-key dict such as {{remove_prefix: s}}")


# ----------------------------------------------------------------------------------------------------------- specs

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


@dataclass
class Spec:
    """One field of the mapping, parsed and checked at construction (errors name ``dataset.columns.<field>``)."""

    key: str
    path: str | None = None
    tokens: tuple = ()
    template: list | None = None  # [(literal, path, tokens, lines), ...]
    value: Any = _UNSET
    rules: list = field(default_factory=list)
    default: Any = _UNSET

    @classmethod
    def parse(cls, spec, key: str) -> Spec:
        if isinstance(spec, str):
            return cls(key, path=spec, tokens=parse_path(spec, key))
        if not isinstance(spec, Mapping):
            raise _config_error(f"{key}: a spec is a path string or a dict with path/template/value, got {spec!r}")
        spec = dict(spec)
        sources = [k for k in ("path", "template", "value") if k in spec]
        if len(sources) != 1:
            raise _config_error(f"{key}: give exactly one of path, template, value (got {sources or 'none'})")
        unknown = set(spec) - {"path", "template", "value", "rules", "default"}
        if unknown:
            raise _config_error(
                f"{key}: unknown spec keys {sorted(unknown)} (known: path, template, value, rules, default)"
            )
        rules = spec.get("rules") or []
        if isinstance(rules, (str, Mapping)):
            rules = [rules]
        out = cls(key, rules=[_parse_rule(r, f"{key}.rules") for r in rules], default=spec.get("default", _UNSET))
        if "path" in spec:
            out.path, out.tokens = spec["path"], parse_path(spec["path"], f"{key}.path")
        elif "template" in spec:
            out.template = _parse_template(spec["template"], f"{key}.template")
        else:
            out.value = spec["value"]
        return out

    @property
    def label(self) -> str:
        if self.path is not None:
            return f"column {self.path!r}"
        if self.template is not None:
            return f"{self.key} (template)"
        return self.key

    def get(self, row):
        """The field's value in ``row`` (rules applied); ``RowError`` names the path when it cannot."""
        if self.value is not _UNSET:
            value = self.value
        elif self.template is not None:
            value = "".join(_render_part(row, part) for part in self.template)
        else:
            try:
                value = resolve(row, self.path, self.tokens)
            except _Missing as e:
                if self.default is not _UNSET:
                    return self.default
                raise RowError(f"{self.label}: the row {e}") from None
            if value is None and self.default is not _UNSET:
                return self.default
        for name, arg in self.rules:
            try:
                value = RULES[name](value, arg)
            except RowError as e:
                raise RowError(f"{self.label} {e}") from None
        return value


def _parse_template(text, key: str) -> list:
    if not isinstance(text, str):
        raise _config_error(f"{key}: a template is a string, got {text!r}")
    parts, pos = [], 0
    for m in _PLACEHOLDER.finditer(text):
        inner = m.group(1).strip()
        lines = inner.endswith("|lines")
        path = inner[: -len("|lines")].strip() if lines else inner
        parts.append((text[pos : m.start()], path, parse_path(path, key), lines))
        pos = m.end()
    parts.append((text[pos:], None, (), False))
    return parts


def _render_part(row, part) -> str:
    literal, path, tokens, lines = part
    if path is None:
        return literal
    try:
        value = resolve(row, path, tokens)
    except _Missing as e:
        raise RowError(f"template field {{{path}}}: the row {e}") from None
    if lines:
        items = value if isinstance(value, (list, tuple)) else [value]
        return literal + "\n".join(str(x) for x in items)
    return literal + (value if isinstance(value, str) else json.dumps(_jsonable(value)))


# ----------------------------------------------------------------------------------------------------------- rows


@dataclass
class Rows:
    rows: list
    source: str  # what messages call the data: dataset.path=<file> / dataset.hub=<path>:<split> / dataset.url=<url>
    lines: list[int] | None = None  # jsonl: the file line of each row

    def where(self, i: int) -> str:
        return f"{self.source} line {self.lines[i]}" if self.lines is not None else f"{self.source} row {i + 1}"


def read_rows(path: str) -> Rows:
    """A local file's rows; a jsonl file keeps each row's line number (for messages)."""
    source = f"dataset.path={path}"
    p = package_file(path)
    if not p.exists():
        raise FileNotFoundError(f"{source}: file not found")
    if p.suffix != ".jsonl" and not p.name.endswith(".jsonl.gz"):
        return Rows(load_table(path), source)
    try:
        rows, lines = read_jsonl(p, source)
    except ValueError as e:
        raise _config_error(str(e)) from None
    return Rows(rows, source, lines)


_OFFLINE_HINT = (
    "offline, download the set where there is internet (datasets.load_dataset(...).to_json('set.jsonl'), or the "
    "hub's parquet files) and set dataset.path=<that .jsonl/.json/.parquet/.csv file> — same schema, no other change"
)


def hub_rows(hub: Mapping, max_rows: int | None = None) -> Rows:
    """``datasets.load_dataset(path, subset, split=split)``; a list of subsets or of splits is concatenated (MATH's
    subjects, Knights-and-Knaves' 3ppl..7ppl). ``max_rows`` reads the first rows of each."""
    path = hub.get("path")
    if not path:
        raise _config_error("dataset.hub.path: no hub dataset named; set it or dataset.path=<local file>")
    subsets, splits = (_as_list(hub.get("subset")), _as_list(hub.get("split") or "train"))
    named = f"/{','.join(map(str, subsets))}" if subsets != [None] else ""
    source = f"dataset.hub={path}{named}:{','.join(map(str, splits))}"
    try:
        from datasets import load_dataset

        rows = []
        for subset in subsets:
            for split in splits:
                part = f"{split}[:{int(max_rows)}]" if max_rows else str(split)
                rows.extend(load_dataset(path, subset, split=part, revision=hub.get("revision")))
    except Exception as e:  # offline, a typo in the name, a gated set: say how to use a local copy instead
        raise _config_error(
            f"{source}: could not load it from the Hugging Face hub ({type(e).__name__}: {e}); {_OFFLINE_HINT}"
        ) from e
    return Rows([dict(r) for r in rows], source)


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def url_rows(url: str, cache_dir: str | None = None) -> Rows:
    """A data file at ``url`` (downloaded once into ``~/.cache/rlexp/datasets``), read like a local file."""
    cache = Path(cache_dir or Path.home() / ".cache" / "rlexp" / "datasets")
    target = cache / Path(url.split("?")[0]).name
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                data = r.read()
        except Exception as e:
            raise _config_error(
                f"dataset.url={url}: could not download it ({type(e).__name__}: {e}); {_OFFLINE_HINT}"
            ) from e
        target.with_suffix(target.suffix + ".part").write_bytes(data)
        target.with_suffix(target.suffix + ".part").rename(target)
    rows = read_rows(str(target))
    return Rows(rows.rows, f"dataset.url={url}", rows.lines)


# ----------------------------------------------------------------------------------------------------------- loader


def _container(x):
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(x, resolve=True) if isinstance(x, (DictConfig, ListConfig)) else x


def _conditions(spec, key: str) -> list[tuple]:
    spec = _container(spec) or {}
    if not isinstance(spec, Mapping):
        raise _config_error(f"{key}: a dict {{path: value or [values]}}, got {spec!r}")
    out = []
    for path, allowed in spec.items():
        allowed = list(allowed) if isinstance(allowed, (list, tuple)) else [allowed]
        out.append((path, parse_path(path, f"{key}.{path}"), {str(a) for a in allowed}))
    return out


def _matches(row, conditions) -> bool:
    for path, tokens, allowed in conditions:
        try:
            value = resolve(row, path, tokens)
        except _Missing:
            return False
        if str(value) not in allowed:
            return False
    return True


@dataclass
class ColumnMapping:
    """The parsed ``columns`` / ``metadata`` of a dataset entry, applied row by row."""

    fields: dict[str, Spec]
    metadata: dict[str, Spec]
    scorer: str

    def record(self, row, i: int, rows: Rows, name: str) -> dict:
        where = rows.where(i)

        def get(spec: Spec):
            try:
                return spec.get(row)
            except RowError as e:
                raise RowError(f"{where}: {e}") from None

        def text(spec: Spec, numbers: bool) -> str:
            value = get(spec)
            if numbers and isinstance(value, float) and not isinstance(value, bool) and value.is_integer():
                value = int(value)  # 27.0 -> "27" (answers stored as floats)
            return text_value(value, f"{where}: {spec.label}", numbers)

        f = self.fields
        question = text(f["question"], numbers=False)
        answer = text(f["answer"], numbers=True) if "answer" in f else ""
        scorer = self.scorer
        meta: dict[str, Any] = {"source": rows.source, "row": i + 1}
        if rows.lines is not None:
            meta["line"] = rows.lines[i]
        if "solution" in f:
            meta["solution"] = text(f["solution"], numbers=True)
        for key, spec in self.metadata.items():
            meta[key] = _jsonable(get(spec))
        record_id = f"{name}-{text(f['id'], numbers=True) if 'id' in f else i}"
        out: dict[str, Any] = {"id": record_id, "question": question, "answer": answer, "scorer": scorer}
        if "options" in f:
            out.update(self._choice(get(f["options"]), answer, question, where, f["options"].label))
            meta.update(options=out.pop("_options"), letters=out.pop("_letters"), correct=out.pop("_correct"))
        if "tests" in f:
            tests = get(f["tests"])
            if tests is None or (isinstance(tests, (list, tuple, dict, str)) and len(tests) == 0):
                raise RowError(f"{where}: {f['tests'].label} has no tests ({tests!r})")
            out["tests"] = _jsonable(tests)
            meta["tests_format"] = classify_tests(out["tests"])
        out["metadata"] = meta
        return out

    @staticmethod
    def _choice(options, answer: str, question: str, where: str, label: str) -> dict:
        from rlexp.data.multiple_choice import render

        if not isinstance(options, (list, tuple)) or len(options) < 2:
            raise RowError(f"{where}: {label} is {_keys(options)}; options must be a list of at least 2")
        if len(options) > len(LETTERS):
            raise RowError(f"{where}: {label} has {len(options)} options; at most {len(LETTERS)}")
        opts = [text_value(o, f"{where}: {label} item {j + 1}", numbers=True) for j, o in enumerate(options)]
        letters = LETTERS[: len(opts)]
        a = answer.strip()
        if a.upper() in letters and len(a) == 1:
            letter = a.upper()
        elif re.fullmatch(r"\d+", a) and int(a) < len(opts) and a not in opts:
            letter = letters[int(a)]  # an index column (MMLU's answer: 2)
        elif a in [o.strip() for o in opts]:
            letter = letters[[o.strip() for o in opts].index(a)]
        else:
            raise RowError(f"{where}: the answer {answer!r} is neither a letter, an index nor one of the options")
        correct = opts[letters.index(letter)]
        return {
            "question": render(question, opts, letters),
            "answer": letter,
            "scorer": "choice",
            "_options": opts,
            "_letters": letters,
            "_correct": correct,
        }


def classify_tests(tests) -> str:
    """How a set states its tests (for the code reward): ``asserts`` (a list of assert statements: MBPP; or
    ``{assert_case: [...]}``), ``stdio`` (``{inputs, outputs}``: APPS, TACO, CodeContests), ``call``
    (``{inputs, outputs, fn_name}``: LeetCode-style calls), ``check`` (``{test_code, entry_point}``: HumanEval-style
    ``check(fn)``), else ``other``."""
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        return "asserts"
    if isinstance(tests, dict):
        if "assert_case" in tests:
            return "asserts"
        if "inputs" in tests and "outputs" in tests:
            return "call" if tests.get("fn_name") else "stdio"
        if "test_code" in tests or ("test" in tests and "entry_point" in tests):
            return "check"
    return "other"


def build_mapping(columns, metadata, scorer: str) -> ColumnMapping:
    columns = _container(columns) or {}
    metadata = _container(metadata) or {}
    if not isinstance(columns, Mapping):
        raise _config_error(f"dataset.columns: a dict field -> spec, got {columns!r}")
    unknown = set(columns) - set(FIELDS)
    if unknown:
        raise _config_error(
            f"dataset.columns: unknown fields {sorted(unknown)} (fields: {', '.join(FIELDS)}; other values go in "
            "dataset.metadata)"
        )
    if scorer not in SCORERS:
        raise _config_error(f"dataset.scorer={scorer!r}: one of {', '.join(SCORERS)}")
    if "question" not in columns:
        raise _config_error("dataset.columns.question: required (where the question is in a row)")
    if scorer == "code":
        if "tests" not in columns:
            raise _config_error("dataset.columns.tests: scorer 'code' needs the tests (the code reward runs them)")
    elif "answer" not in columns:
        raise _config_error(f"dataset.columns.answer: required for scorer {scorer!r}")
    if not isinstance(metadata, Mapping):
        raise _config_error(f"dataset.metadata: a dict name -> spec, got {metadata!r}")
    taken = sorted(set(metadata) & set(RESERVED_METADATA))
    if taken:
        raise _config_error(
            f"dataset.metadata: {taken} are set by the loader ({', '.join(RESERVED_METADATA)}); use another name "
            "(e.g. source_set for a set's own 'source' column)"
        )
    if scorer == "reasoning_gym" and "source_dataset" not in metadata:
        raise _config_error(
            "dataset.metadata.source_dataset: scorer 'reasoning_gym' needs the task whose scorer checks the answers "
            "(e.g. source_dataset: {value: knights_knaves})"
        )
    fields = {k: Spec.parse(v, f"dataset.columns.{k}") for k, v in columns.items() if v is not None}
    meta = {k: Spec.parse(v, f"dataset.metadata.{k}") for k, v in metadata.items()}
    return ColumnMapping(fields, meta, scorer)


def mapped_dataset(
    seed: int,
    columns: Mapping,
    name: str = "mapped",
    path: str | None = None,
    hub: Mapping | None = None,
    url: str | None = None,
    scorer: str = "math",
    metadata: Mapping | None = None,
    where: Mapping | None = None,
    exclude: Mapping | None = None,
    invalid_rows: str = "error",
    max_rows: int | None = None,
    eval_size: int = 200,
    train_size: int | None = None,
    data_files: str | None = None,
) -> DatasetSplits:
    """A dataset read through a column mapping (module docstring) from ``path`` (a local file; ``data_files`` is
    its older name in ``dataset=gsm8k``), else ``hub``, else ``url``."""
    mapping = build_mapping(columns, metadata, scorer)
    if invalid_rows not in INVALID_ROWS:
        raise _config_error(f"dataset.invalid_rows={invalid_rows!r}: one of {', '.join(INVALID_ROWS)}")
    keep, drop = _conditions(where, "dataset.where"), _conditions(exclude, "dataset.exclude")
    local = path or data_files
    hub = _container(hub) or {}
    if local:
        rows = read_rows(str(local))
    elif hub.get("path"):
        rows = hub_rows(hub, max_rows)  # sliced per split by datasets itself
    elif url:
        rows = url_rows(url)
    else:
        raise _config_error(
            f"dataset {name}: no data — set dataset.path=<local file> (or dataset.hub.path / dataset.url)"
        )
    if max_rows and len(rows.rows) > int(max_rows):
        n = int(max_rows)
        rows = Rows(rows.rows[:n], rows.source, rows.lines[:n] if rows.lines is not None else None)
    if not rows.rows:
        raise _config_error(f"{rows.source}: no rows")
    records, skipped = [], []
    for i, row in enumerate(rows.rows):
        if (keep and not _matches(row, keep)) or (drop and _matches(row, drop)):
            continue
        try:
            records.append(mapping.record(row, i, rows, name))
        except (RowError, ValueError) as e:  # ConfigError is a ValueError: text_value's refusals
            if invalid_rows == "error":
                raise _config_error(str(e)) from None
            skipped.append(str(e))
    if skipped:
        log.warning(
            "dataset %s: skipped %d of %d rows that do not fit the mapping (first: %s)",
            name,
            len(skipped),
            len(rows.rows),
            skipped[0],
        )
    if not records:
        why = f"; all {len(skipped)} rows were skipped (first: {skipped[0]})" if skipped else ""
        raise _config_error(f"{rows.source}: no row passes dataset.where/exclude{why}")
    return _split(name, records, eval_size, seed, train_size)


# ------------------------------------------------------------------------------------------------------- reasoning gym


def _rg_names() -> list[str]:
    DATASETS = import_reasoning_gym().factory.DATASETS
    return sorted(n for n in DATASETS if n != "composite")


def _mixture(tasks) -> list[tuple[str, float, dict]]:
    """``{name: weight}`` | ``{name: {weight, options}}`` | ``[{name, weight, options}]`` | ``[name, ...]`` ->
    ``[(name, weight, options)]``."""
    tasks = _container(tasks)
    out = []
    if isinstance(tasks, Mapping):
        for task, spec in tasks.items():
            if isinstance(spec, Mapping):
                out.append((task, spec.get("weight", 1.0), dict(spec.get("options") or {})))
            else:
                out.append((task, spec, {}))
    elif isinstance(tasks, Sequence) and not isinstance(tasks, str):
        for item in tasks:
            if isinstance(item, str):
                out.append((item, 1.0, {}))
            elif isinstance(item, Mapping) and "name" in item:
                out.append((item["name"], item.get("weight", 1.0), dict(item.get("options") or {})))
            else:
                raise _config_error(f"dataset.tasks: an item is a task name or {{name, weight, options}}, got {item!r}")
    else:
        raise _config_error(f"dataset.tasks: a dict {{task: weight}} or a list, got {tasks!r}")
    for task, weight, _ in out:
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not math.isfinite(weight) or weight <= 0:
            raise _config_error(f"dataset.tasks.{task}: weight {weight!r} must be a positive number")
    if len({t for t, _, _ in out}) != len(out):
        raise _config_error("dataset.tasks: a task is listed twice")
    if not out:
        raise _config_error("dataset.tasks: empty")
    return out


def reasoning_gym_tasks(
    seed: int,
    task: str | None = None,
    tasks: Any = None,
    options: Mapping | None = None,
    name: str = "reasoning_gym",
    train_size: int = 2000,
    eval_size: int = 100,
) -> DatasetSplits:
    """Any reasoning-gym task (``dataset.task=<name>``, with ``dataset.options``), or a weighted mixture
    (``dataset.tasks={chain_sum: 2, gcd: 1}``, or ``{name: {weight, options}}``): each item is drawn from a task with
    probability weight / total (reasoning-gym's ``CompositeDataset``, seeded), and keeps the task's own scorer
    (``metadata.source_dataset``)."""
    from rlexp.data.sources import reasoning_gym_task

    known = _rg_names()
    if (task is None) == (tasks is None):
        raise _config_error(
            "dataset.task / dataset.tasks: set one — dataset.task=<name> for one task, dataset.tasks={a: 2, b: 1} for "
            f"a weighted mixture; tasks: {', '.join(known)}"
        )
    if task is not None:
        if task not in known:
            raise _config_error(f"dataset.task={task!r}: not a reasoning-gym task; tasks: {', '.join(known)}")
        splits = reasoning_gym_task(task, seed, train_size, eval_size, dict(_container(options) or {}))
        return DatasetSplits(f"{name}/{task}", splits.train, splits.eval)
    if options:
        raise _config_error(
            "dataset.options: with dataset.tasks give each task's options there ({name: {weight, options}})"
        )
    mix = _mixture(tasks)
    for t, _, _ in mix:
        if t not in known:
            raise _config_error(f"dataset.tasks: {t!r} is not a reasoning-gym task; tasks: {', '.join(known)}")
    rg = import_reasoning_gym()
    from reasoning_gym.composite import DatasetSpec

    size = int((train_size + eval_size) * 1.2) + 10
    try:
        ds = rg.create_dataset(
            "composite", size=size, seed=seed, datasets=[DatasetSpec(t, float(w), o) for t, w, o in mix]
        )
    except Exception as e:  # a bad option of one task: name it
        raise _config_error(f"dataset.tasks={[(t, w, o) for t, w, o in mix]}: {e}") from e
    records = []
    for i, e in enumerate(ds):
        meta = _jsonable(e["metadata"])
        records.append(
            {
                "id": f"{meta.get('source_dataset', 'rg')}-{i}",
                "question": e["question"],
                "answer": str(e["answer"]),
                "scorer": "reasoning_gym",
                "metadata": meta,
            }
        )
    label = ",".join(f"{t}:{w:g}" for t, w, _ in mix)
    return _split(f"{name}/mix({label})", records, eval_size, seed, train_size)
