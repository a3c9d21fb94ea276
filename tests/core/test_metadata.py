"""Package metadata: one version, one compatible range between the meta package and its members, classifiers."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MEMBERS = ["core", "trainer", *(f"integrations/{name}" for name in ("langchain", "autogen", "openai_agents", "crewai"))]


def _project(folder: str) -> dict[str, object]:
    with (REPO / folder / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["project"]


def _requirements(project: dict[str, object]) -> list[str]:
    deps = list(project.get("dependencies", []))  # type: ignore[call-overload]
    for extra in dict(project.get("optional-dependencies", {})).values():  # type: ignore[call-overload]
        deps.extend(extra)
    return deps


def test_every_package_has_one_version_and_pins_members_to_its_compatible_range() -> None:
    meta = _project(".")
    version = str(meta["version"])
    expected = f"~={version}"
    seen = 0
    for folder in [".", *MEMBERS]:
        project = _project(folder)
        assert project["version"] == version, folder
        for requirement in _requirements(project):
            match = re.fullmatch(r"(agentlightning-[a-z-]+)(\[[a-z,]+\])?(.*)", requirement)
            if match:
                seen += 1
                assert match.group(3) == expected, f"{folder}: {requirement} (every member range is {expected})"
    assert seen >= 12  # the meta package's extras and every member's core requirement


@pytest.mark.parametrize("folder", [".", *MEMBERS])
def test_classifiers_match_what_the_project_runs_on(folder: str) -> None:
    project = _project(folder)
    classifiers = list(project["classifiers"])  # type: ignore[call-overload]
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert project["requires-python"] == ">=3.11"
    # A license expression (PEP 639) replaces the license classifiers; hatchling refuses both.
    assert project["license"] == "MIT" and not any(c.startswith("License ::") for c in classifiers)
    assert ("Typing :: Typed" in classifiers) == (folder != ".")  # the meta package ships no code
