"""The offline world: fictional countries, cities, people and organisations, written as documents,
with multi-hop questions about them.

Owns: `WorldSpec` (what determines the world), the deterministic generation of entities, documents
and questions from a seed, the train / held-out split by entity, and writing them as JSONL files
(`corpus.jsonl`, `train.jsonl`, `heldout.jsonl`) cached under `<cache>/deepresearch/world-<key>/`.
Does not own: reading those files (`data.py`), retrieval, the agent or the reward.

The split is by person: a held-out person, the organisation they founded and every question about
either are held out, so a held-out question's chain shares no person or organisation with training
and its answer cannot be memorised from training questions (cities and countries are shared: they
are the answers' vocabulary). Names are lowercase words made of the syllables the tiny model's
tokenizer was trained on, so they stay a few tokens long.

Question kinds (hops = searches a careful agent needs):

    birthplace (1)             where was <person> born?                        → city
    founder (1)                who founded <org>?                              → person
    base (1)                   where is <org> based?                           → city
    founder_birthplace (2)     where was the founder of <org> born?            → city
    birth_country (2)          in which country was <person> born?             → country
    base_country (2)           in which country is <org> based?                → country
    founder_birth_country (3)  in which country was the founder of <org> born? → country
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORLD_FORMAT = 1  # bump when generation changes its output; part of the cache key
SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "qui", "ber", "nal", "sto", "pre", "dun")
ORG_KINDS = ("house", "trust", "group", "press")
PROFESSIONS = ("painter", "farmer", "writer", "doctor", "teacher", "builder", "singer", "sailor")
QUESTION_KINDS = ("birthplace", "founder", "base", "founder_birthplace", "birth_country", "base_country",
                  "founder_birth_country")
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class WorldSpec:
    """Everything that determines the generated world; equal specs write identical files."""

    seed: int = 0  # seeds names, relations and the split
    countries: int = 16
    cities: int = 240
    people: int = 1200
    organisations: int = 500  # each founded by a different person
    events: int = 800  # distractor documents mentioning a person and a city
    held_out_fraction: float = 0.2  # share of people (with their organisations) held out

    def __post_init__(self) -> None:
        if self.organisations > self.people:
            raise ValueError(f"WorldSpec.organisations={self.organisations} needs as many people (each founds one); "
                             f"people={self.people}")
        if self.organisations > len(SYLLABLES) ** 2 * len(ORG_KINDS):
            raise ValueError(f"WorldSpec.organisations={self.organisations} exceeds the distinct organisation names")
        if self.cities + self.people > len(SYLLABLES) ** 3:
            raise ValueError("WorldSpec.cities + people exceeds the distinct three-syllable names")
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"WorldSpec.held_out_fraction={self.held_out_fraction} must be in (0, 1)")

    def key(self) -> str:
        text = json.dumps([WORLD_FORMAT, dataclasses.asdict(self)], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Document:
    """One retrievable document; `doc_id` is unique in the corpus."""

    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Person:
    doc_id: str
    name: str
    city: str  # doc id of the birth city
    year: int
    profession: str
    split: str


@dataclass(frozen=True)
class Organisation:
    doc_id: str
    name: str
    founder: str  # doc id of the founding person
    city: str  # doc id of the city it is based in
    year: int


@dataclass(frozen=True)
class World:
    """The generated entities; `names` maps every entity doc id to its name."""

    countries: dict[str, str]  # doc id → name
    cities: dict[str, tuple[str, str]]  # doc id → (name, country doc id)
    people: dict[str, Person]
    organisations: dict[str, Organisation]
    events: tuple[Document, ...]

    def name(self, doc_id: str) -> str:
        if doc_id in self.people:
            return self.people[doc_id].name
        if doc_id in self.organisations:
            return self.organisations[doc_id].name
        if doc_id in self.cities:
            return self.cities[doc_id][0]
        return self.countries[doc_id]


def _words(syllable_count: int, rng: random.Random) -> list[str]:
    words = ["".join(parts) for parts in itertools.product(SYLLABLES, repeat=syllable_count)]
    rng.shuffle(words)
    return words


def generate_world(spec: WorldSpec) -> World:
    """Entities and relations from `spec.seed` (pure, deterministic)."""
    rng = random.Random(spec.seed)
    two, three = _words(2, rng), _words(3, rng)
    countries = {f"n{i}": f"{two[i]}land" for i in range(spec.countries)}
    city_names, surnames = three[: spec.cities], three[spec.cities :]
    cities = {f"c{i}": (city_names[i], f"n{rng.randrange(spec.countries)}") for i in range(spec.cities)}
    first_names = two[spec.countries : spec.countries + 60]
    full_names = [f"{first} {last}" for first, last in zip(itertools.cycle(first_names), surnames)][: spec.people]
    held_out = set(rng.sample(range(spec.people), int(spec.people * spec.held_out_fraction)))
    people = {
        f"p{i}": Person(f"p{i}", full_names[i], f"c{rng.randrange(spec.cities)}", rng.randrange(1900, 2000),
                        rng.choice(PROFESSIONS), "heldout" if i in held_out else "train")
        for i in range(spec.people)
    }
    org_names = [f"{word} {kind}" for word, kind in itertools.product(two, ORG_KINDS)]
    rng.shuffle(org_names)
    founders = rng.sample(sorted(people, key=lambda d: int(d[1:])), spec.organisations)
    organisations = {
        f"o{i}": Organisation(f"o{i}", org_names[i], founders[i], f"c{rng.randrange(spec.cities)}",
                              rng.randrange(1950, 2020))
        for i in range(spec.organisations)
    }
    events = tuple(_event(f"e{i}", rng, people, cities) for i in range(spec.events))
    return World(countries, cities, people, organisations, events)


def _event(doc_id: str, rng: random.Random, people: dict[str, Person], cities: dict[str, tuple[str, str]]) -> Document:
    person = people[f"p{rng.randrange(len(people))}"]
    city = cities[f"c{rng.randrange(len(cities))}"][0]
    year = rng.randrange(1950, 2020)
    return Document(doc_id, f"{person.name} in {city}",
                    f"{person.name} gave a talk in {city} about the {person.profession} trade in {year}.")


def documents(world: World) -> list[Document]:
    """The corpus: one document per entity plus the distractor events, in a fixed order."""
    docs = [Document(d, name, f"{name} is a country.") for d, name in world.countries.items()]
    docs += [Document(d, name, f"{name} is a city in {world.countries[country]}.")
             for d, (name, country) in world.cities.items()]
    docs += [Document(p.doc_id, p.name, f"{p.name} was born in {world.cities[p.city][0]}. "
                                        f"{p.name} works as a {p.profession} since {p.year}.")
             for p in world.people.values()]
    docs += [Document(o.doc_id, o.name, f"{o.name} was founded by {world.people[o.founder].name} and is based in "
                                        f"{world.cities[o.city][0]}. it opened in {o.year}.")
             for o in world.organisations.values()]
    return docs + list(world.events)


def questions(world: World) -> list[dict[str, Any]]:
    """Every question of every kind, each with its split, answer, hops and gold chain."""
    rows = []
    for person in world.people.values():
        city, country = person.city, world.cities[person.city][1]
        rows.append(_row("birthplace", f"where was {person.name} born?", [person.doc_id], world, person.split,
                         answer_id=city))
        rows.append(_row("birth_country", f"in which country was {person.name} born?", [person.doc_id, city],
                         world, person.split, answer_id=country))
    for org in world.organisations.values():
        split = world.people[org.founder].split
        founder_city = world.people[org.founder].city
        rows.append(_row("founder", f"who founded {org.name}?", [org.doc_id], world, split, answer_id=org.founder))
        rows.append(_row("base", f"where is {org.name} based?", [org.doc_id], world, split, answer_id=org.city))
        rows.append(_row("founder_birthplace", f"where was the founder of {org.name} born?",
                         [org.doc_id, org.founder], world, split, answer_id=founder_city))
        rows.append(_row("base_country", f"in which country is {org.name} based?", [org.doc_id, org.city], world,
                         split, answer_id=world.cities[org.city][1]))
        rows.append(_row("founder_birth_country", f"in which country was the founder of {org.name} born?",
                         [org.doc_id, org.founder, founder_city], world, split,
                         answer_id=world.cities[founder_city][1]))
    return rows


def _row(kind: str, question: str, chain: list[str], world: World, split: str, answer_id: str) -> dict[str, Any]:
    """A question row; `chain` lists the documents to read in order, their names are the search queries."""
    return {
        "id": f"{kind}:{chain[0]}",
        "question": question,
        "answer": world.name(answer_id),
        "kind": kind,
        "hops": len(chain),
        "gold_doc_ids": list(chain),
        "search_queries": [world.name(doc_id) for doc_id in chain],
        "split": split,
    }


def split_questions(rows: list[dict[str, Any]], seed: int) -> dict[str, list[dict[str, Any]]]:
    """Rows by split, each shuffled with `seed` (so any prefix mixes kinds)."""
    by_split = {split: [row for row in rows if row["split"] == split] for split in SPLITS}
    for split, split_rows in by_split.items():
        random.Random(f"{seed}:{split}").shuffle(split_rows)
    return by_split


def write_world(spec: WorldSpec, directory: Path) -> None:
    """Write corpus.jsonl, train.jsonl, heldout.jsonl and spec.json into `directory`."""
    world = generate_world(spec)
    directory.mkdir(parents=True, exist_ok=True)
    _write_jsonl(directory / "corpus.jsonl", [dataclasses.asdict(d) for d in documents(world)])
    for split, rows in split_questions(questions(world), spec.seed).items():
        _write_jsonl(directory / f"{split}.jsonl", rows)
    (directory / "spec.json").write_text(json.dumps(dataclasses.asdict(spec), sort_keys=True) + "\n")


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")


def ensure_world(spec: WorldSpec = WorldSpec(), cache_dir: Path | None = None) -> Path:
    """Directory holding the world's JSONL files, generating it first if not cached (atomic publish)."""
    from fullasync.models import cached_build, default_cache_root

    root = Path(cache_dir) if cache_dir is not None else default_cache_root()

    def build_into(out_dir: Path) -> dict:
        write_world(spec, out_dir)
        return dataclasses.asdict(spec)

    return cached_build(root / "deepresearch" / f"world-{spec.key()}", build_into)
