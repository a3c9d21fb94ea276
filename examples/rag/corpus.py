"""A small MuSiQue-style world made by code: entities, relations, one passage per fact, and 2–3 hop questions.

Films have directors and studios; people have birthplaces and spouses; studios have headquarters; cities lie in
countries. A question composes relations along a chain (``film -director-> person -birthplace-> city``), so
answering it needs one retrieval per hop, each hop's answer being the bridge entity the next hop starts from.
Everything is derived from a seed: the same seed gives the same corpus and questions on every machine.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Final

FILMS: Final = ("Alpha", "Borealis", "Cascade", "Drift", "Ember", "Fathom", "Glacier", "Harbor", "Ivory", "Juniper",
                "Kestrel", "Lantern", "Meridian", "Nocturne", "Orchid", "Prism")  # fmt: skip
PEOPLE: Final = ("Marlow", "Keaton", "Varga", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Reyes", "Novak",
                 "Haddad", "Brennan", "Sato", "Dubois", "Kowalski", "Ferreira", "Larsen", "Quinn", "Abara", "Volkov",
                 "Castillo")  # fmt: skip
STUDIOS: Final = ("Sunbeam", "Northlight", "Bluefield", "Redstone", "Silverline")
CITIES: Final = ("Oslo", "Lyon", "Porto", "Kyoto", "Lagos", "Quito", "Tampere", "Gdansk", "Izmir", "Perth")
COUNTRY_OF_CITY: Final = {
    "Oslo": "Norway", "Lyon": "France", "Porto": "Portugal", "Kyoto": "Japan", "Lagos": "Nigeria",
    "Quito": "Ecuador", "Tampere": "Finland", "Gdansk": "Poland", "Izmir": "Turkey", "Perth": "Australia",
}  # fmt: skip

# relation -> the sentence a passage states it with ({s} subject, {o} object)
RELATIONS: Final = {
    "director": "The director of {s} is {o} .",
    "studio": "The studio of {s} is {o} .",
    "birthplace": "The birthplace of {s} is {o} .",
    "spouse": "The spouse of {s} is {o} .",
    "headquarters": "The headquarters of {s} is {o} .",
    "country": "The country of {s} is {o} .",
}

# question template -> the relation chain it composes, first hop first (MuSiQue composes 2-4 single-hop questions)
TEMPLATES: Final = {
    "where was the director of {e} born": ("director", "birthplace"),
    "who is the spouse of the director of {e}": ("director", "spouse"),
    "where is the studio of {e} based": ("studio", "headquarters"),
    "in which country was the director of {e} born": ("director", "birthplace", "country"),
    "where was the spouse of the director of {e} born": ("director", "spouse", "birthplace"),
    "in which country is the studio of {e} based": ("studio", "headquarters", "country"),
}


@dataclass(frozen=True)
class Passage:
    """One retrievable fact: its title (the subject entity), relation, object entity and text."""

    title: str
    relation: str
    answer: str
    text: str


@dataclass(frozen=True)
class World:
    """The corpus (one passage per fact) and the facts as a lookup ``(subject, relation) -> object``."""

    passages: tuple[Passage, ...]
    facts: dict[tuple[str, str], str]

    def follow(self, start: str, chain: tuple[str, ...]) -> list[str]:
        """The entities a relation chain visits from ``start`` (the last one is the answer)."""
        path = [start]
        for relation in chain:
            path.append(self.facts[(path[-1], relation)])
        return path


def build_world(seed: int = 0) -> World:
    """Random facts over the fixed entity lists; every film has a director and a studio, every person a spouse."""
    rng = random.Random(seed)
    facts: dict[tuple[str, str], str] = {}
    people = list(PEOPLE)
    rng.shuffle(people)
    for a, b in zip(people[::2], people[1::2], strict=True):  # spouses come in pairs
        facts[(a, "spouse")], facts[(b, "spouse")] = b, a
    for person in PEOPLE:
        facts[(person, "birthplace")] = rng.choice(CITIES)
    for film in FILMS:
        facts[(film, "director")] = rng.choice(PEOPLE)
        facts[(film, "studio")] = rng.choice(STUDIOS)
    for studio in STUDIOS:
        facts[(studio, "headquarters")] = rng.choice(CITIES)
    for city, country in COUNTRY_OF_CITY.items():
        facts[(city, "country")] = country
    passages = tuple(
        Passage(subject, relation, obj, RELATIONS[relation].format(s=subject, o=obj))
        for (subject, relation), obj in sorted(facts.items())
    )
    return World(passages, facts)


def questions(world: World) -> list[dict[str, Any]]:
    """Every (template, film) question with its gold answer, chain and the bridge entities of its gold path."""
    out: list[dict[str, Any]] = []
    for template, chain in TEMPLATES.items():
        for film in FILMS:
            path = world.follow(film, chain)
            out.append(
                {"question": template.format(e=film), "topic": film, "answer": path[-1], "hops": len(chain),
                 "chain": list(chain), "path": path}
            )  # fmt: skip
    return out


def split(seed: int = 0, n_val: int = 24) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and validation questions: validation asks about films no training question mentions."""
    world = build_world(seed)
    films = list(FILMS)
    random.Random(seed + 1).shuffle(films)
    held_out = set(films[: max(1, n_val // len(TEMPLATES))])
    every = questions(world)
    return [q for q in every if q["topic"] not in held_out], [q for q in every if q["topic"] in held_out]


def normalize_answer(text: str) -> list[str]:
    """Lower-cased word tokens without punctuation and articles (the SQuAD/MuSiQue answer normalisation)."""
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in ("a", "an", "the")]


def answer_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between a predicted and a gold answer (MuSiQue's answer metric)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    common = sum(min(pred.count(w), ref.count(w)) for w in set(pred))
    if not pred or not ref or common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised answers are identical."""
    return 1.0 if normalize_answer(prediction) == normalize_answer(gold) else 0.0
