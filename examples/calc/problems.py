"""The calc example's data, made by code: two-step arithmetic word problems from templates, with their exact answers.

Each template is one story with three numbers and two operations in the order the story tells them: the first
combines the first two numbers, the second combines that result with the third (``plus`` then ``minus`` for "has 5,
gets 3 more, then gives away 2"). Names, objects and numbers vary; every intermediate and final answer is a positive
whole number.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Final

OPERATIONS: Final = ("plus", "minus", "times", "divided")

# (template, (first operation, second operation)). Templates are lower case with few distinct words: every word is a
# token of the tiny CPU policy. A first step and a second step never share their cue words ("gets ... more" is always
# a first step, "finds ... more" a second): mirrored stories (plus then minus, minus then plus) would otherwise differ
# only in word order, which a 2-layer policy learns far slower (a CI run rose only 0.07 -> 0.36 in 40 steps).
TEMPLATES: Final[tuple[tuple[str, tuple[str, str]], ...]] = (
    ("{name} has {a} {things} and gets {b} more, then loses {c}. how many {things} does {name} have now",
     ("plus", "minus")),
    ("{name} had {a} {things} and gave away {b}, then finds {c} more. how many {things} does {name} have now",
     ("minus", "plus")),
    ("{name} buys {a} bags with {b} {things} in each and finds {c} more. how many {things} does {name} have now",
     ("times", "plus")),
    ("there are {a} rows of {b} {things} and {c} are sold. how many {things} remain", ("times", "minus")),
    ("a box holds {a} red {things} and {b} blue {things}, shared by {c} friends. how many {things} does each "
     "friend get", ("plus", "divided")),
    ("there are {a} rows of {b} {things}, shared by {c} friends. how many {things} does each friend get",
     ("times", "divided")),
    ("{name} had {a} {things} and gave away {b}, and the rest are shared by {c} friends. how many {things} does "
     "each friend get", ("minus", "divided")),
)  # fmt: skip
NAMES: Final = ("ann", "bob", "carl", "dora", "eve", "finn", "gus", "hana")
THINGS: Final = ("apples", "coins", "books", "shells", "cards", "pens")


@dataclass(frozen=True)
class Problem:
    """One task: the problem text, its three numbers in order, the two operations that solve it, and the answer."""

    problem: str
    numbers: tuple[int, int, int]
    operations: tuple[str, str]
    answer: int

    def as_task(self) -> dict[str, object]:
        """The JSON-serialisable rollout input."""
        return asdict(self)


def apply(operation: str, x: float, y: float) -> float:
    """``x <operation> y`` for one of :data:`OPERATIONS`."""
    if operation == "divided" and y == 0:
        raise ValueError("division by zero")
    return {"plus": x + y, "minus": x - y, "times": x * y, "divided": x / y if y else 0.0}[operation]


def _numbers(operations: tuple[str, str], rng: random.Random) -> tuple[int, int, int]:
    """Three numbers for which both steps give positive whole numbers."""
    first, second = operations
    if second == "divided":
        c = rng.randint(2, 6)
        if first == "times":  # a rows of b things shared by c: make a a multiple of c
            return c * rng.randint(1, 4), rng.randint(2, 9), c
        total = c * rng.randint(2, 9)
        if first == "plus":
            a = rng.randint(1, total - 1)
            return a, total - a, c
        b = rng.randint(1, 30)  # minus
        return total + b, b, c
    if first == "times":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
    elif first == "minus":
        b = rng.randint(1, 30)
        a, b = b + rng.randint(2, 30), b
    else:
        a, b = rng.randint(1, 30), rng.randint(1, 30)
    result = int(apply(first, a, b))
    c = rng.randint(1, result - 1) if second == "minus" else rng.randint(1, 30)
    return a, b, c


def solve(operations: tuple[str, str], numbers: tuple[int, int, int]) -> int:
    """The answer of a problem: the first operation on the first two numbers, the second on that and the third."""
    a, b, c = numbers
    return int(apply(operations[1], apply(operations[0], a, b), c))


def problems(n_per_template: int, *, seed: int) -> list[Problem]:
    """``n_per_template`` problems per template (names, objects and numbers drawn with ``seed``), interleaved."""
    rng = random.Random(seed)
    out: list[Problem] = []
    for _ in range(n_per_template):
        for template, operations in TEMPLATES:
            numbers = _numbers(operations, rng)
            a, b, c = numbers
            text = template.format(name=rng.choice(NAMES), things=rng.choice(THINGS), a=a, b=b, c=c)
            out.append(Problem(text, numbers, operations, solve(operations, numbers)))
    return out


def train_val(n_train: int = 8, n_val: int = 2, *, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """Training problems and held-out validation problems (same templates, other names, objects and numbers)."""
    return problems(n_train, seed=seed), problems(n_val, seed=seed + 1000)
