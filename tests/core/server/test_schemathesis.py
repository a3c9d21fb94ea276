"""Property-based fuzzing of every operation in the OpenAPI spec: no input may cause a 5xx (bounded, in process)."""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings, strategies as st
from schemathesis.core.errors import UnsupportedSchema
from schemathesis.core.result import Ok

from agentlightning.server import create_app
from agentlightning.store import SqliteLightningStore

EXAMPLES_PER_OPERATION = 8


async def test_no_operation_answers_5xx(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "fuzz.db", synchronous="NORMAL")
    # Real ids, so fuzzed bodies also reach the store's logic instead of stopping at "unknown rollout".
    await store.enqueue_rollout({"task": 1}, max_attempts=3)
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    known = {"rollout_id": claimed.rollout.rollout_id, "attempt_id": claimed.attempt.attempt_id}
    # A short wait cap: fuzzed claim/wait timeouts must not stretch the run.
    app = create_app(store, max_wait_s=0.05, max_body_bytes=256 * 1024, max_spans_per_request=100)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
    assert len(operations) >= 20
    failures: list[str] = []

    for operation in operations:
        positive = [operation.as_strategy(schemathesis.GenerationMode.POSITIVE)]
        names = {p.name for p in operation.path_parameters}
        if names and names <= known.keys():
            ids = {name: known[name] for name in names}
            positive.append(operation.as_strategy(schemathesis.GenerationMode.POSITIVE, path_parameters=ids))
        negative = operation.as_strategy(schemathesis.GenerationMode.NEGATIVE)
        try:
            _fuzz(st.one_of([*positive, negative]), failures)
        except UnsupportedSchema:  # schemathesis cannot negate some pydantic schemas; positive cases still run
            _fuzz(st.one_of(positive), failures)
    await store.close()
    assert failures == []


def _fuzz(cases: st.SearchStrategy[schemathesis.Case], failures: list[str]) -> None:
    @given(case=cases)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,  # the same inputs every run: a failure here is reproducible, never flaky
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call()  # the ASGI app runs on schemathesis' own thread and loop
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text}")

    fuzz()
