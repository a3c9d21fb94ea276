"""The SQL example's data, made by code: a small company database in SQLite and template questions with gold SQL.

Three related tables (``departments``, ``employees``, ``projects``), generated from a fixed seed, and a few hundred
natural-language questions, each with the gold query that answers it. Nothing is downloaded. Questions whose answer a
query sketch can express (an aggregate over one column, optionally for one department) carry that ``sketch`` too:
they form the reduced task the tiny CPU policy learns.
"""

from __future__ import annotations

import math
import random
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

SCHEMA: Final = """\
CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, budget INTEGER NOT NULL);
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT NOT NULL, age INTEGER NOT NULL, salary INTEGER NOT NULL,
  department_id INTEGER NOT NULL REFERENCES departments(id));
CREATE TABLE projects (id INTEGER PRIMARY KEY, name TEXT NOT NULL, cost INTEGER NOT NULL, hours INTEGER NOT NULL,
  department_id INTEGER NOT NULL REFERENCES departments(id));"""

DEPARTMENTS: Final[tuple[tuple[str, str], ...]] = (
    ("sales", "london"),
    ("research", "paris"),
    ("finance", "london"),
    ("support", "berlin"),
    ("marketing", "paris"),
    ("legal", "berlin"),
)
CITIES: Final[tuple[str, ...]] = ("london", "paris", "berlin")
_FIRST_NAMES: Final = (
    "ada", "alan", "grace", "linus", "barbara", "ken", "margaret", "dennis", "frances", "edsger", "radia", "john",
    "sophie", "tim", "karen", "guido", "hedy", "donald", "shafi", "niklaus", "anita", "bjarne", "lynn", "james",
)  # fmt: skip
_PROJECT_NAMES: Final = (
    "apollo", "borealis", "cobalt", "delta", "ember", "falcon", "granite", "harbor", "iris", "juniper", "kestrel",
    "lumen", "meridian", "nimbus", "orion", "pioneer", "quartz", "raven",
)  # fmt: skip

# Columns an aggregate question can be about: column -> (table, plural noun of the table's rows).
NUMERIC_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "salary": ("employees", "employees"),
    "age": ("employees", "employees"),
    "budget": ("departments", "departments"),
    "cost": ("projects", "projects"),
    "hours": ("projects", "projects"),
}
TABLES: Final[tuple[str, ...]] = ("employees", "departments", "projects")
AGGREGATES: Final[dict[str, str]] = {"count": "COUNT", "sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN"}

# Phrasings per aggregate. Some use a word the sketch language also accepts (average, total, highest, ...), others
# do not (mean, largest, ...): a policy cannot get them all right by copying words of the question.
_AGGREGATE_PHRASES: Final[dict[str, tuple[str, ...]]] = {
    "avg": ("what is the average {col} of the {rows}", "what is the mean {col} of the {rows}"),
    "sum": ("what is the total {col} of all {rows}", "add up the {col} of every one of the {rows}"),
    "max": ("what is the highest {col} among the {rows}", "what is the largest {col} of the {rows}"),
    "min": ("what is the lowest {col} among the {rows}", "what is the smallest {col} of the {rows}"),
}
_COUNT_PHRASES: Final = ("how many {rows} are there", "what is the number of {rows}", "count the {rows}")
_DEPARTMENT_PHRASES: Final[dict[tuple[str, str], str]] = {
    ("count", "employees"): "how many employees work in {dept}",
    ("count", "projects"): "how many projects does {dept} run",
    ("avg", "salary"): "what is the average salary in {dept}",
    ("max", "salary"): "what is the highest salary in {dept}",
    ("min", "age"): "how old is the youngest employee in {dept}",
    ("sum", "cost"): "what is the total cost of the projects of {dept}",
    ("sum", "hours"): "how many hours do the projects of {dept} take in total",
}


@dataclass(frozen=True)
class Question:
    """One task: the question, its gold SQL, its kind, and its query sketch when the sketch language covers it."""

    question: str
    gold_sql: str
    kind: str
    sketch: str | None = None

    def as_task(self) -> dict[str, Any]:
        """The JSON-serialisable rollout input."""
        return asdict(self)


def build_database(path: Path, *, seed: int = 7) -> Path:
    """Write the company database to ``path`` (replacing it); the same seed always gives the same rows."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA)
        for index, (name, city) in enumerate(DEPARTMENTS, start=1):
            db.execute(
                "INSERT INTO departments VALUES (?, ?, ?, ?)", (index, name, city, rng.randrange(50, 500) * 1000)
            )
        for index, name in enumerate(_FIRST_NAMES, start=1):
            row = (
                index,
                name,
                rng.randrange(22, 65),
                rng.randrange(30, 150) * 1000,
                rng.randrange(len(DEPARTMENTS)) + 1,
            )
            db.execute("INSERT INTO employees VALUES (?, ?, ?, ?, ?)", row)
        for index, name in enumerate(_PROJECT_NAMES, start=1):
            row = (
                index,
                name,
                rng.randrange(5, 120) * 1000,
                rng.randrange(40, 900),
                rng.randrange(len(DEPARTMENTS)) + 1,
            )
            db.execute("INSERT INTO projects VALUES (?, ?, ?, ?, ?)", row)
    return path


def sketch_sql(aggregate: str, column: str, department: str | None = None) -> str:
    """The SQL a sketch stands for: ``aggregate`` of ``column`` (or ``count`` of a table), for one department."""
    if column in TABLES:
        if aggregate != "count":
            raise ValueError(f"only count applies to a whole table; got {aggregate} {column}")
        table, target = column, "*"
    else:
        table, target = NUMERIC_COLUMNS[column][0], column
    select = f"SELECT {AGGREGATES[aggregate]}({target}) FROM {table}"
    if department is None:
        return select
    if table == "departments":
        return f"{select} WHERE name = '{department}'"
    alias = table[0]
    target = "*" if target == "*" else f"{alias}.{target}"
    return (
        f"SELECT {AGGREGATES[aggregate]}({target}) FROM {table} {alias} JOIN departments d "
        f"ON {alias}.department_id = d.id WHERE d.name = '{department}'"
    )


def _sketchable() -> list[Question]:
    out: list[Question] = []
    for table in TABLES:
        for phrase in _COUNT_PHRASES:
            out.append(Question(phrase.format(rows=table), sketch_sql("count", table), "count", f"count {table}"))
    for aggregate, phrases in _AGGREGATE_PHRASES.items():
        for column, (_, rows) in NUMERIC_COLUMNS.items():
            for phrase in phrases:
                text = phrase.format(col=column, rows=rows)
                out.append(Question(text, sketch_sql(aggregate, column), "aggregate", f"{aggregate} {column}"))
    for (aggregate, column), phrase in _DEPARTMENT_PHRASES.items():
        for dept, _ in DEPARTMENTS:
            sql = sketch_sql(aggregate, column, dept)
            out.append(Question(phrase.format(dept=dept), sql, "department", f"{aggregate} {column} {dept}"))
    return out


def _open_questions(db_path: Path) -> list[Question]:
    """Questions outside the sketch language: lookups, lists, comparisons, superlatives, per-city joins."""
    with sqlite3.connect(db_path) as db:
        employees = [r[0] for r in db.execute("SELECT name FROM employees ORDER BY id")]
        projects = [r[0] for r in db.execute("SELECT name FROM projects ORDER BY id")]
    out: list[Question] = []
    for name in employees:
        out.append(Question(f"how old is {name}", f"SELECT age FROM employees WHERE name = '{name}'", "lookup"))
        out.append(
            Question(f"what is the salary of {name}", f"SELECT salary FROM employees WHERE name = '{name}'", "lookup")
        )
        out.append(Question(
            f"which department does {name} work in",
            f"SELECT d.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE e.name = '{name}'",
            "join",
        ))  # fmt: skip
    for name in projects:
        out.append(
            Question(
                f"how much does the {name} project cost", f"SELECT cost FROM projects WHERE name = '{name}'", "lookup"
            )
        )
        out.append(Question(
            f"which department runs the {name} project",
            f"SELECT d.name FROM projects p JOIN departments d ON p.department_id = d.id WHERE p.name = '{name}'",
            "join",
        ))  # fmt: skip
    for dept, _ in DEPARTMENTS:
        out.append(
            Question(
                f"in which city is the {dept} department",
                f"SELECT city FROM departments WHERE name = '{dept}'",
                "lookup",
            )
        )
        out.append(
            Question(f"what is the budget of {dept}", f"SELECT budget FROM departments WHERE name = '{dept}'", "lookup")
        )
        out.append(Question(
            f"list the employees of {dept}",
            f"SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = '{dept}'",
            "join",
        ))  # fmt: skip
    for age in (30, 40, 50, 60):
        out.append(
            Question(f"list the employees older than {age}", f"SELECT name FROM employees WHERE age > {age}", "filter")
        )
        out.append(
            Question(
                f"how many employees are younger than {age}",
                f"SELECT COUNT(*) FROM employees WHERE age < {age}",
                "filter",
            )
        )
    for amount in (20000, 50000, 80000, 100000):
        out.append(
            Question(
                f"which projects cost more than {amount}", f"SELECT name FROM projects WHERE cost > {amount}", "filter"
            )
        )
        out.append(
            Question(f"who earns more than {amount}", f"SELECT name FROM employees WHERE salary > {amount}", "filter")
        )
    for city in CITIES:
        out.append(Question(
            f"how many employees work in {city}",
            "SELECT COUNT(*) FROM employees e JOIN departments d ON e.department_id = d.id "
            f"WHERE d.city = '{city}'",
            "join",
        ))  # fmt: skip
        out.append(
            Question(
                f"which departments are in {city}", f"SELECT name FROM departments WHERE city = '{city}'", "filter"
            )
        )
        out.append(
            Question(
                f"what is the total budget of the departments in {city}",
                f"SELECT SUM(budget) FROM departments WHERE city = '{city}'",
                "filter",
            )
        )
    superlatives = (
        ("who is the oldest employee", "SELECT name FROM employees ORDER BY age DESC LIMIT 1"),
        ("who is the youngest employee", "SELECT name FROM employees ORDER BY age ASC LIMIT 1"),
        ("who earns the most", "SELECT name FROM employees ORDER BY salary DESC LIMIT 1"),
        ("which project costs the most", "SELECT name FROM projects ORDER BY cost DESC LIMIT 1"),
        ("which project takes the fewest hours", "SELECT name FROM projects ORDER BY hours ASC LIMIT 1"),
        ("which department has the largest budget", "SELECT name FROM departments ORDER BY budget DESC LIMIT 1"),
        (
            "which department has the most employees",
            "SELECT d.name FROM departments d JOIN employees e ON e.department_id = d.id "
            "GROUP BY d.id ORDER BY COUNT(*) DESC, d.id LIMIT 1",
        ),
        (
            "which department spends the most on projects",
            "SELECT d.name FROM departments d JOIN projects p ON p.department_id = d.id "
            "GROUP BY d.id ORDER BY SUM(p.cost) DESC, d.id LIMIT 1",
        ),
        (
            "what is the average salary per department",
            "SELECT d.name, AVG(e.salary) FROM departments d JOIN employees e ON e.department_id = d.id GROUP BY d.id",
        ),
        (
            "how many projects does each department run",
            "SELECT d.name, COUNT(p.id) FROM departments d LEFT JOIN projects p ON p.department_id = d.id "
            "GROUP BY d.id",
        ),
    )
    out.extend(Question(text, sql, "superlative") for text, sql in superlatives)
    return out


def questions(db_path: Path) -> list[Question]:
    """Every question of the example (a few hundred), sketchable ones first, in a fixed order."""
    return _sketchable() + _open_questions(db_path)


def split(items: list[Question], *, val_fraction: float = 0.25, seed: int = 0) -> tuple[list[Question], list[Question]]:
    """A fixed train/validation split of ``items`` (shuffled with ``seed``)."""
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    cut = max(1, round(len(shuffled) * val_fraction))
    return shuffled[cut:], shuffled[:cut]


def run_sql(db_path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on a read-only connection (so no query of a model can change the database)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


def _normalised(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    def value(v: Any) -> Any:
        if isinstance(v, float):
            return round(v, 4) if math.isfinite(v) else str(v)
        return v

    return sorted((tuple(value(v) for v in row) for row in rows), key=repr)


def execution_match(db_path: Path, predicted_sql: str | None, gold_sql: str) -> float:
    """1.0 when ``predicted_sql`` returns the same rows as ``gold_sql`` (order ignored), else 0.0 (errors too)."""
    if not predicted_sql:
        return 0.0
    try:
        predicted = run_sql(db_path, predicted_sql)
    except sqlite3.Error:
        return 0.0
    return 1.0 if _normalised(predicted) == _normalised(run_sql(db_path, gold_sql)) else 0.0
