"""The calc example's data, made by code: arithmetic word problems from templates, with their exact answers.

Each template is one story whose answer is one operation on its two numbers, in a fixed order: ``first plus
second``, ``second minus first``, ``first divided by second``, ... (first and second = the numbers in the order the
problem states them). Names, objects and numbers vary; divisions always come out whole.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Final

# (template, expression over first/second). Templates are lower case with few distinct words: every word is a token
# of the tiny CPU policy.
TEMPLATES: Final[tuple[tuple[str, str], ...]] = (
    ("{name} has {a} {things} and gets {b} more. how many {things} does {name} have now", "first plus second"),
    ("a box holds {a} red {things} and {b} blue {things}. how many {things} are in the box", "first plus second"),
    ("{name} had {a} {things} and gave away {b}. how many {things} are left", "first minus second"),
    ("a shelf holds {a} {things}. {b} are sold. how many {things} remain", "first minus second"),
    ("{name} has {a} {things} but needs {b}. how many more {things} does {name} need", "second minus first"),
    ("{name} buys {a} bags with {b} {things} in each. how many {things} does {name} buy", "first times second"),
    ("there are {a} rows of {b} {things}. how many {things} are there", "first times second"),
    ("{a} {things} are shared by {b} friends. how many {things} does each friend get", "first divided by second"),
    ("each bag holds {a} {things}. how many bags are needed for {b} {things}", "second divided by first"),
)  # fmt: skip
NAMES: Final = ("ann", "bob", "carl", "dora", "eve", "finn", "gus", "hana")
THINGS: Final = ("apples", "coins", "books", "shells", "cards", "pens")


@dataclass(frozen=True)
class Problem:
    """One task: the problem text, its two numbers in order, the expression that solves it, and the answer."""

    problem: str
    numbers: tuple[int, int]
    expression: str
    answer: int

    def as_task(self) -> dict[str, Any]:
        """The JSON-serialisable rollout input."""
        return asdict(self)


def _numbers(expression: str, rng: random.Random) -> tuple[int, int]:
    """Two numbers for which ``expression`` has a positive whole answer."""
    if expression == "first divided by second":
        second = rng.randint(2, 9)
        return second * rng.randint(2, 9), second
    if expression == "second divided by first":
        first = rng.randint(2, 9)
        return first, first * rng.randint(2, 9)
    if expression == "first minus second":
        second = rng.randint(1, 40)
        return second + rng.randint(1, 40), second
    if expression == "second minus first":
        first = rng.randint(1, 40)
        return first, first + rng.randint(1, 40)
    if expression == "first times second":
        return rng.randint(2, 12), rng.randint(2, 12)
    return rng.randint(1, 60), rng.randint(1, 60)


def evaluate(expression: str, first: int, second: int) -> int:
    """The value of one of the templates' expressions."""
    left, operator, right = expression.replace("divided by", "divided").split()
    x, y = (first, second) if left == "first" else (second, first)
    if right == left:
        raise ValueError(f"expression {expression!r} uses the same number twice")
    results = {"plus": x + y, "minus": x - y, "times": x * y, "divided": x // y}
    return results[operator]


def problems(n_per_template: int, *, seed: int) -> list[Problem]:
    """``n_per_template`` problems per template (names, objects and numbers drawn with ``seed``), interleaved."""
    rng = random.Random(seed)
    out: list[Problem] = []
    for _ in range(n_per_template):
        for template, expression in TEMPLATES:
            a, b = _numbers(expression, rng)
            text = template.format(name=rng.choice(NAMES), things=rng.choice(THINGS), a=a, b=b)
            out.append(Problem(text, (a, b), expression, evaluate(expression, a, b)))
    return out


def train_val(n_train: int = 8, n_val: int = 2, *, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """Training problems and held-out validation problems (same templates, other names, objects and numbers)."""
    return problems(n_train, seed=seed), problems(n_val, seed=seed + 1000)
