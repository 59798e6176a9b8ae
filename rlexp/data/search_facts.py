"""Synthetic facts for search-based question answering (issue 28): a deterministic fictional world — people, towns,
organisations with invented names and attributes ("Orla Venmark was a cartographer born in 1873 in Keldmoor.") —
written as a retrieval corpus, and questions about it, one and two hops. No model can know these facts, so
retrieval (``tools=[retrieval]``, ``rlexp.tools.retrieval``) truly helps: the search methods (StepSearch, Search-R1
style) can be trained and measured offline, on the CPU, without wiki-18.

The world (``world``: ``seed``, ``people``, ``towns``, ``organisations``) is made by hashing, not by a random
generator, so it is the same on every Python version and machine. Each entity is one document:

* town ``t<i>``: "Keldmoor is a town in Vessany on the river Tavel. It was founded in 1412.";
* person ``p<i>``: "Orla Venmark was a cartographer born in 1873 in Keldmoor.";
* organisation ``o<i>``: "The Ashgrove Society is a learned society founded in 1902 by Orla Venmark. Its
  headquarters are in Brindlecombe."

The corpus is a JSONL in the schema Search-R1 and FlashRAG use for wiki-18 — ``{"id", "contents"}`` with
``contents = '"Title"\\ntext'`` — written at first use to ``<cache_dir>/search_facts/world-<hash>/corpus.jsonl``
(``cache_dir``: ``$RLEXP_CACHE``, default ``~/.cache/rlexp``) with the questions beside it (``qa.jsonl``); the
retrieval tool's default corpus is that file (``corpus_file``).

Questions (``kinds``): one hop — ``birth_year`` ("In what year was Orla Venmark born?"), ``birthplace``,
``founder`` ("Who founded the Ashgrove Society?"), ``river`` ("On which river does Keldmoor lie?"); two hops —
``birthplace_river`` ("On which river lies the town where Orla Venmark was born?": person → town),
``founder_birth_year``, ``founder_birthplace`` (organisation → person), ``headquarters_river`` (organisation → town).
A record, in the NQ/HotpotQA schema with StepSearch's step-wise fields::

    {"id": "search_facts-<kind>-<entity>", "question": ..., "answer": "1873", "scorer": "qa",
     "metadata": {"answers": [aliases], "hops": 1 | 2, "kind": ..., "supporting_docs": [{"id", "title", "text"}]
                  (in hop order), "search_keys": [[sub-query expressions] per hop], "source_dataset": "search_facts"}}

``scorer: qa`` is SQuAD-normalised exact match over the answer and its aliases (``rlexp.rewards.search``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rlexp.data.sources import DatasetSplits, _split

FORMAT = 1  # bump when the world's text or the files' layout change
KINDS = (
    "birth_year",
    "birthplace",
    "founder",
    "river",
    "birthplace_river",
    "founder_birth_year",
    "founder_birthplace",
    "headquarters_river",
)

FIRST = (
    "Orla", "Bram", "Isolde", "Corin", "Maelis", "Dorran", "Elspet", "Fenwick", "Galen", "Hesper", "Ivo", "Jessamy",
    "Kestrel", "Lorcan", "Mirabel", "Nestor", "Oriel", "Perrin", "Quilla", "Rowan", "Sabine", "Tobiah", "Ulrika",
    "Vesna", "Wystan", "Yselle", "Zoran", "Aurelie", "Benedek", "Calla",
)  # fmt: skip
LAST_HEAD = ("Ven", "Hal", "Cor", "Mor", "Ash", "Bel", "Dru", "Ferr", "Grim", "Lind", "Quen", "Tarr", "Wick", "Ost")
LAST_TAIL = ("mark", "ridge", "lowe", "stan", "berg", "wyn", "holt", "ford", "mere", "by", "tor", "lock")
TOWN_HEAD = ("Keld", "Brin", "Ulver", "Marrow", "Fal", "Thorn", "Ebbing", "Cray", "Oxen", "Wend", "Lark", "Sedge")
TOWN_TAIL = ("moor", "combe", "haven", "stead", "wick", "holm", "ford", "gate", "mouth", "dale")
COUNTRIES = ("Vessany", "Calderra", "Orlund", "Mirrenland", "Thessaly Minor", "Quarvia")
RIVERS = (
    "Tavel", "Ombre", "Seld", "Varrow", "Lethen", "Corra", "Amsel", "Dwyn", "Isket", "Pell", "Rhune", "Sorrow",
    "Tarn", "Ulla", "Wenning", "Yarrow",
)  # fmt: skip
OCCUPATIONS = (
    "cartographer", "glassblower", "astronomer", "composer", "botanist", "shipwright", "clockmaker", "engraver",
    "physician", "surveyor", "weaver", "bookbinder", "architect", "lexicographer",
)  # fmt: skip
ORG_ADJ = ("Ashgrove", "Silverlea", "Northmoor", "Hollin", "Greywater", "Emberly", "Foxglove", "Kingsfold", "Wrenhall")
ORG_NOUN = (
    ("Society", "learned society"),
    ("Guild", "craft guild"),
    ("Company", "trading company"),
    ("Institute", "research institute"),
    ("Lodge", "fraternal lodge"),
    ("Academy", "music academy"),
)


def pick(seed: int, key: str, n: int) -> int:
    """A deterministic index in [0, n) for ``key`` under ``seed`` (SHA-256: the same everywhere)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def _unique_names(seed: int, kind: str, count: int, make) -> list[str]:
    """``count`` distinct names from ``make(k)``, trying keys ``kind:0``, ``kind:1``, … in turn."""
    names, seen, k = [], set(), 0
    while len(names) < count:
        if k > 200 * (count + 1):
            raise ValueError(f"dataset.{kind}={count}: more than the name tables can make distinct")
        name = make(f"{kind}:{k}")
        k += 1
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def world(seed: int = 0, people: int = 48, towns: int = 24, organisations: int = 24) -> dict:
    """The fictional world of ``seed``: {"towns", "people", "organisations"}, each a list of attribute dicts."""
    for key, v in (("people", people), ("towns", towns), ("organisations", organisations)):
        if v < 1:
            raise ValueError(f"dataset.{key} must be >= 1, got {v}")

    def person_name(key: str) -> str:
        first = FIRST[pick(seed, key + ":first", len(FIRST))]
        head, tail = (
            LAST_HEAD[pick(seed, key + ":h", len(LAST_HEAD))],
            LAST_TAIL[pick(seed, key + ":t", len(LAST_TAIL))],
        )
        return f"{first} {head}{tail}"

    def town_name(key: str) -> str:
        return TOWN_HEAD[pick(seed, key + ":h", len(TOWN_HEAD))] + TOWN_TAIL[pick(seed, key + ":t", len(TOWN_TAIL))]

    def org_name(key: str) -> str:
        return f"{ORG_ADJ[pick(seed, key + ':a', len(ORG_ADJ))]} {ORG_NOUN[pick(seed, key + ':n', len(ORG_NOUN))][0]}"

    town_list = [
        {
            "id": f"t{i}",
            "name": name,
            "country": COUNTRIES[pick(seed, f"town{i}:country", len(COUNTRIES))],
            "river": RIVERS[pick(seed, f"town{i}:river", len(RIVERS))],
            "founded": 1100 + pick(seed, f"town{i}:founded", 600),
        }
        for i, name in enumerate(_unique_names(seed, "towns", towns, town_name))
    ]
    people_list = [
        {
            "id": f"p{i}",
            "name": name,
            "occupation": OCCUPATIONS[pick(seed, f"person{i}:occupation", len(OCCUPATIONS))],
            "born": 1790 + pick(seed, f"person{i}:born", 160),
            "birthplace": town_list[pick(seed, f"person{i}:birthplace", towns)]["id"],
        }
        for i, name in enumerate(_unique_names(seed, "people", people, person_name))
    ]
    org_list = []
    for i, name in enumerate(_unique_names(seed, "organisations", organisations, org_name)):
        founder = people_list[pick(seed, f"org{i}:founder", people)]
        kind = next(desc for noun, desc in ORG_NOUN if name.endswith(noun))
        org_list.append(
            {
                "id": f"o{i}",
                "name": f"the {name}",
                "kind": kind,
                "founder": founder["id"],
                "founded": founder["born"] + 25 + pick(seed, f"org{i}:founded", 30),
                "headquarters": town_list[pick(seed, f"org{i}:hq", towns)]["id"],
            }
        )
    return {"towns": town_list, "people": people_list, "organisations": org_list}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def documents(w: dict) -> list[dict]:
    """The world's corpus: one ``{"id", "title", "text"}`` per entity (towns, people, organisations)."""
    towns = {t["id"]: t for t in w["towns"]}
    people = {p["id"]: p for p in w["people"]}
    docs = [
        {
            "id": t["id"],
            "title": t["name"],
            "text": f"{t['name']} is a town in {t['country']} on the river {t['river']}. "
            f"It was founded in {t['founded']}.",
        }
        for t in w["towns"]
    ]
    docs += [
        {
            "id": p["id"],
            "title": p["name"],
            "text": f"{p['name']} was {_article(p['occupation'])} {p['occupation']} born in {p['born']} in "
            f"{towns[p['birthplace']]['name']}.",
        }
        for p in w["people"]
    ]
    docs += [
        {
            "id": o["id"],
            "title": o["name"][4:],  # without "the "
            "text": f"{o['name'][0].upper()}{o['name'][1:]} is {_article(o['kind'])} {o['kind']} founded in "
            f"{o['founded']} by {people[o['founder']]['name']}. Its headquarters are in "
            f"{towns[o['headquarters']]['name']}.",
        }
        for o in w["organisations"]
    ]
    return docs


def _river_answers(river: str) -> list[str]:
    return [river, f"river {river}", f"the {river}", f"{river} river"]


def questions(w: dict, kinds: tuple[str, ...] | list[str] = KINDS) -> list[dict]:
    """The world's questions of ``kinds`` (see module doc), in a fixed order: kind, then entity."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"dataset.kinds: {bad} not among {list(KINDS)}")
    docs = {d["id"]: d for d in documents(w)}
    towns = {t["id"]: t for t in w["towns"]}
    people = {p["id"]: p for p in w["people"]}
    out = []

    def add(kind, entity, question, answer, aliases, support, keys):
        out.append(
            {
                "id": f"search_facts-{kind}-{entity}",
                "question": question,
                "answer": str(answer),
                "scorer": "qa",
                "metadata": {
                    "answers": [str(a) for a in aliases],
                    "hops": len(support),
                    "kind": kind,
                    "supporting_docs": [dict(docs[s]) for s in support],
                    "search_keys": keys,
                    "source_dataset": "search_facts",
                },
            }
        )

    for kind in kinds:
        if kind in ("birth_year", "birthplace", "birthplace_river"):
            for p in w["people"]:
                n, town = p["name"], towns[p["birthplace"]]
                if kind == "birth_year":
                    add(
                        kind,
                        p["id"],
                        f"In what year was {n} born?",
                        p["born"],
                        [p["born"]],
                        [p["id"]],
                        [[n, f"{n} born"]],
                    )
                elif kind == "birthplace":
                    add(
                        kind,
                        p["id"],
                        f"In which town was {n} born?",
                        town["name"],
                        [town["name"]],
                        [p["id"]],
                        [[n, f"{n} birthplace", f"{n} born"]],
                    )
                else:
                    add(
                        kind,
                        p["id"],
                        f"On which river lies the town where {n} was born?",
                        town["river"],
                        _river_answers(town["river"]),
                        [p["id"], town["id"]],
                        [[n, f"{n} born", f"{n} birthplace"], [town["name"], f"{town['name']} river"]],
                    )
        elif kind == "river":
            for t in w["towns"]:
                add(
                    kind,
                    t["id"],
                    f"On which river does {t['name']} lie?",
                    t["river"],
                    _river_answers(t["river"]),
                    [t["id"]],
                    [[t["name"], f"{t['name']} river"]],
                )
        else:
            for o in w["organisations"]:
                founder, hq, name = people[o["founder"]], towns[o["headquarters"]], o["name"]
                f_keys = [name[4:], f"{name[4:]} founder", f"founder of {name}"]
                if kind == "founder":
                    add(kind, o["id"], f"Who founded {name}?", founder["name"], [founder["name"]], [o["id"]], [f_keys])
                elif kind == "founder_birth_year":
                    add(
                        kind,
                        o["id"],
                        f"In what year was the founder of {name} born?",
                        founder["born"],
                        [founder["born"]],
                        [o["id"], founder["id"]],
                        [f_keys, [founder["name"], f"{founder['name']} born"]],
                    )
                elif kind == "founder_birthplace":
                    town = towns[founder["birthplace"]]
                    add(
                        kind,
                        o["id"],
                        f"In which town was the founder of {name} born?",
                        town["name"],
                        [town["name"]],
                        [o["id"], founder["id"]],
                        [f_keys, [founder["name"], f"{founder['name']} birthplace"]],
                    )
                else:
                    add(
                        kind,
                        o["id"],
                        f"On which river lies the town where {name} has its headquarters?",
                        hq["river"],
                        _river_answers(hq["river"]),
                        [o["id"], hq["id"]],
                        [[name[4:], f"{name[4:]} headquarters"], [hq["name"], f"{hq['name']} river"]],
                    )
    return out


def corpus_line(doc: dict) -> str:
    """A document as a line of the wiki-18 JSONL schema: ``{"id", "contents": '"Title"\\ntext'}``."""
    return json.dumps({"id": doc["id"], "contents": f'"{doc["title"]}"\n{doc["text"]}'}, ensure_ascii=False)


def world_folder(seed: int, people: int, towns: int, organisations: int, cache_dir: str | Path | None = None) -> Path:
    if cache_dir is None:
        from rlexp.models.loading import default_cache_dir

        cache_dir = default_cache_dir()
    key = {"seed": seed, "people": people, "towns": towns, "organisations": organisations, "v": FORMAT}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / "search_facts" / f"world-{digest}"


def _write(path: Path, lines: list[str]) -> None:
    if path.exists():
        return
    tmp = path.with_suffix(f".tmp{pick(0, str(path), 10**9)}")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)  # atomic: a reader never sees half a file


def corpus_file(
    seed: int = 0, people: int = 48, towns: int = 24, organisations: int = 24, cache_dir: str | None = None
) -> str:
    """The path of the world's corpus JSONL (written, with ``qa.jsonl`` of every question, at first use)."""
    w = world(seed, people, towns, organisations)
    folder = world_folder(seed, people, towns, organisations, cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / "corpus.jsonl", [corpus_line(d) for d in documents(w)])
    _write(folder / "qa.jsonl", [json.dumps(q, ensure_ascii=False) for q in questions(w)])
    return str(folder / "corpus.jsonl")


def search_facts(
    seed: int,
    name: str = "search_facts",
    world_seed: int = 0,
    people: int = 48,
    towns: int = 24,
    organisations: int = 24,
    kinds: list[str] | None = None,
    train_size: int | None = None,
    eval_size: int = 64,
    cache_dir: str | None = None,
) -> DatasetSplits:
    """Questions about the fictional world of ``world_seed`` (see module doc), split under ``seed``; the corpus is
    written to the cache for the retrieval tool (``corpus_file``)."""
    corpus_file(world_seed, people, towns, organisations, cache_dir)
    records = questions(world(world_seed, people, towns, organisations), tuple(kinds or KINDS))
    return _split(name, records, eval_size, seed, train_size)
