"""The overhead benchmark stays runnable (its numbers are read by people, not asserted: machines are shared)."""

from __future__ import annotations

import pytest

from bench.integration_crewai import main


def test_bench_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m bench.integration_crewai --quick`` prints every mode and drops no span."""
    main(["--quick"])
    out = capsys.readouterr().out
    for mode in ("no listener", "ours, no-op tracer", "ours (instrument())", "target < 100 µs"):
        assert mode in out
    assert "dropped: 0" in out
