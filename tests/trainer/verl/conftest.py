"""The verl suite runs in its own environment (.venv-verl, see requirements-verl.txt); elsewhere it skips.

verl's own import-time warnings are not ours to fix; each ignore below names where it comes from.
"""

from __future__ import annotations

import pytest

# Warnings raised while verl imports (the suite turns every other warning into an error):
VERL_IMPORT_WARNINGS = (
    # verl.workers.engine.__init__ announces each optional engine it cannot import (torchtitan, veomni, ...).
    r"ignore:\w+ engine is not available:UserWarning",
    # verl imports ray.experimental.state, which ray 2.60 deprecates in favour of ray.util.state.
    r"ignore::DeprecationWarning:ray\.util\.state\.util",
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the narrow verl ignores (collection imports verl, so per-test markers would come too late)."""
    for rule in VERL_IMPORT_WARNINGS:
        config.addinivalue_line("filterwarnings", rule)
