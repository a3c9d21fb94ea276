"""Views over time: resources snapshots with their diffs, and workers from the attempts they claimed."""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Sequence

from agentlightning.dashboard._digest import RolloutDigest
from agentlightning.dashboard._models import FieldChange, ResourceItem, ResourceVersion, WorkerRow
from agentlightning.types import LLM, PromptTemplate, Resource, ResourcesSnapshot, Rollout


def resource_versions(snapshots: Sequence[ResourcesSnapshot], usage: dict[str, int]) -> list[ResourceVersion]:
    """Snapshots newest first, each resource compared with the same name in the snapshot before it.

    ``usage`` maps a resources id to the number of rollouts that ran with it.
    """
    versions: list[ResourceVersion] = []
    previous: dict[str, Resource] = {}
    for snapshot in sorted(snapshots, key=lambda s: s.version):
        items = [_item(name, resource, previous.get(name)) for name, resource in sorted(snapshot.resources.items())]
        versions.append(
            ResourceVersion(
                resources_id=snapshot.resources_id,
                version=snapshot.version,
                create_ms=snapshot.create_time / 1e6,
                items=items,
                removed=sorted(previous.keys() - snapshot.resources.keys()),
                rollouts=usage.get(snapshot.resources_id, 0),
                changed=[item.name for item in items if item.added or item.changed],
            )
        )
        previous = dict(snapshot.resources)
    versions.reverse()
    return versions


def _item(name: str, resource: Resource, before: Resource | None) -> ResourceItem:
    added = before is None
    if isinstance(resource, PromptTemplate):
        old = before.template if isinstance(before, PromptTemplate) else None
        changed = not added and (old != resource.template or before != resource)
        diff: list[str] = []
        fields: list[FieldChange] = []
        if isinstance(before, PromptTemplate) and before.engine != resource.engine:
            fields.append(FieldChange(field="engine", before=before.engine, after=resource.engine))
        if old is not None and old != resource.template:
            lines = difflib.unified_diff(
                old.splitlines(), resource.template.splitlines(), "previous", "this version", lineterm="", n=2
            )
            diff = list(lines)[2:]  # the two file-name header lines say nothing here
        return ResourceItem(
            name=name,
            kind=resource.kind,
            changed=changed,
            added=added,
            template=resource.template,
            engine=resource.engine,
            diff=diff,
            field_changes=fields,
        )
    assert isinstance(resource, LLM)
    # The API key is left out on purpose: the page is for looking, and keys end up in screenshots.
    return ResourceItem(
        name=name,
        kind=resource.kind,
        changed=not added and before != resource,
        added=added,
        model=resource.model,
        base_url=resource.base_url,
        weights_version=resource.weights_version,
        sampling=dict(resource.sampling),
        field_changes=_llm_changes(before, resource) if isinstance(before, LLM) else [],
    )


def _llm_changes(before: LLM, after: LLM) -> list[FieldChange]:
    """The LLM fields that differ, in the order people look for them; the API key only as "changed"."""
    changes: list[FieldChange] = []
    for name in ("base_url", "model", "weights_version", "sampling", "agent_models", "proxied"):
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            changes.append(FieldChange(field=name, before=_shown(old), after=_shown(new)))
    if before.api_key != after.api_key:
        changes.append(FieldChange(field="api_key", before="(hidden)", after="(hidden, changed)"))
    return changes


def _shown(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def resources_id_of(rollout: Rollout, digest: RolloutDigest) -> str | None:
    """The snapshot the rollout ran with: its latest attempt's, else the one it asked for."""
    latest = digest.latest
    if latest is not None and latest.resources_id is not None:
        return latest.resources_id
    return rollout.resources_id


def worker_rows(digests: Sequence[RolloutDigest], silent_after_s: float) -> list[WorkerRow]:
    """Workers from the attempts they claimed: busy (a live attempt heard from lately), silent, or idle."""
    now_ms = time.time_ns() / 1e6
    rows: dict[str, WorkerRow] = {}
    live_heard: dict[str, float] = {}  # latest sign of life of each worker's unfinished attempts
    for digest in digests:
        for attempt in digest.attempts:
            worker = attempt.worker_id or "(unnamed)"
            row = rows.get(worker)
            if row is None:
                row = WorkerRow(
                    worker_id=worker,
                    state="idle",
                    attempts=0,
                    running=0,
                    succeeded=0,
                    failed=0,
                    last_heartbeat_ms=None,
                    current_rollouts=[],
                    last_rollout_id=None,
                )
                rows[worker] = row
            row.attempts += 1
            seen = attempt.last_heartbeat_time or attempt.end_time or attempt.start_time
            if row.last_heartbeat_ms is None or seen / 1e6 > row.last_heartbeat_ms:
                row.last_heartbeat_ms = seen / 1e6
                row.last_rollout_id = attempt.rollout_id
            if attempt.status == "succeeded":
                row.succeeded += 1
            elif attempt.is_terminal:
                row.failed += 1
            else:
                row.running += 1
                row.current_rollouts.append(attempt.rollout_id)
                live_heard[worker] = max(live_heard.get(worker, 0.0), seen / 1e6)
    for row in rows.values():
        if row.running:
            heard = live_heard.get(row.worker_id, 0.0)
            row.state = "busy" if now_ms - heard <= silent_after_s * 1000 else "silent"
    return sorted(rows.values(), key=lambda r: (-(r.last_heartbeat_ms or 0.0), r.worker_id))
