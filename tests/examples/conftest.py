"""The examples' tests run in two environments: the crew example needs .venv-crewai (CrewAI pins ``openai<3``)."""

from __future__ import annotations

import importlib.util

# In the main environment ``pytest tests/examples`` skips the crew directory instead of failing on its import;
# scripts/run_tests.sh runs it in .venv-crewai.
collect_ignore = [] if importlib.util.find_spec("crewai") else ["crew"]
