"""What an edit will do, said before it is done: `PATCH /jobs/{id}/?dry_run=true` and the
console's edit form (docs/decisions/0069-edit-preview.md).

The same validation as the PATCH (jobs.rules.edits.job_changes) and the same effects
(jobs.dispatch.planning.edit_effects, which jobs.services.update_job applies), on a
lock-free read; then what they mean: the job's fire times over the next week before
and after, whether a run is due now because of the edit, what the misfire rules do with
slots already past, and the ledger ranges it records. Read-only: nothing here writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobs import audit
from jobs.dispatch import planning
from jobs.models import Job, MisfirePolicy
from jobs.rules import edits
from runs.keys import format_utc

WINDOW = timedelta(days=7)
# Fire times examined per side: a week of a minutely job is 10,080; a denser interval
# is compared over the part of the week its first SCAN slots cover.
SCAN = 20_000


@dataclass(frozen=True)
class SlotDiff:
    """The job's fire times in [now, until], before and after the edit."""

    until: datetime
    truncated: bool  # `until` is earlier than a week from now: a side had more than SCAN slots
    before: list[datetime]
    after: list[datetime]

    @property
    def added(self) -> list[datetime]:
        return sorted(set(self.after) - set(self.before))

    @property
    def removed(self) -> list[datetime]:
        return sorted(set(self.before) - set(self.after))


@dataclass(frozen=True)
class PastSlots:
    """The slots already due and never dispatched, and what becomes of them."""

    count: int
    count_is_lower_bound: bool
    first: datetime | None
    last: datetime | None
    will_run: int
    rule: str  # none | schedule_changed | paused | on_time | misfire_policy
    note: str


@dataclass(frozen=True)
class DueNow:
    due: bool  # after the edit, the scheduler dispatches a slot at once
    because_of_edit: bool  # ... and it would not have without the edit
    note: str


@dataclass(frozen=True)
class EditPreview:
    now: datetime
    stored: Job  # the job as it is
    effects: planning.EditEffects  # effects.job: the job as the edit leaves it
    diff: dict[str, Any]  # the audit entry's {field: [old, new]} (secrets redacted)
    slots: SlotDiff
    due_now: DueNow
    past: PastSlots


def preview_edit(*, job: Job, changes: Mapping[str, Any], now: datetime) -> EditPreview:
    """What `update_job(job=job, changes=changes)` would do at `now`; raises JobInvalid as it does."""
    clean = edits.job_changes(job, changes, now=now)
    effects = planning.edit_effects(job, clean, now=now)
    if effects.changes or effects.pause or effects.resume:
        effects.job.updated_at = now  # every save stamps it
    if effects.pause is not None and effects.pause.misfire is not None and hasattr(job, "misfire_count"):
        effects.job.misfire_count = job.misfire_count + 1  # the API's count, as it will read
    return EditPreview(
        now=now,
        stored=job,
        effects=effects,
        diff=audit.plain(audit.field_diff(before=effects.before, after=effects.changes)),
        slots=_slots(job, effects.job, now=now),
        due_now=_due_now(job, effects.job, now=now),
        past=_past(job, effects, now=now),
    )


def upcoming(job: Job, *, now: datetime, until: datetime, limit: int) -> list[datetime]:
    """The slots the scheduler will fire in [now, until], oldest first, at most `limit`:
    the one the job waits for, then its schedule's; none while paused. A slot already
    past is the misfire rules' (`PastSlots`), not listed here."""
    due = job.next_run_at
    if job.paused or due is None:
        return []
    if due < now:
        return planning.slots_between(job, after=now - timedelta(microseconds=1), until=until, limit=limit)
    first = [due] if due <= until and (job.end_at is None or due <= job.end_at) else []
    return first + planning.slots_between(job, after=due, until=until, limit=limit - len(first))


def _slots(before: Job, after: Job, *, now: datetime) -> SlotDiff:
    until = now + WINDOW
    old = upcoming(before, now=now, until=until, limit=SCAN + 1)
    new = upcoming(after, now=now, until=until, limit=SCAN + 1)
    capped = [side[SCAN - 1] for side in (old, new) if len(side) > SCAN]
    if capped:
        until = min(capped)
        old, new = [t for t in old if t <= until], [t for t in new if t <= until]
    return SlotDiff(until=until, truncated=bool(capped), before=old, after=new)


def _due(job: Job, now: datetime) -> bool:
    return not job.paused and job.next_run_at is not None and job.next_run_at <= now


def _due_now(before: Job, after: Job, *, now: datetime) -> DueNow:
    due, was = _due(after, now), _due(before, now)
    if due and not was:
        note = (
            f"Yes: the slot {format_utc(after.next_run_at)} is due, and the scheduler dispatches it at once."
        )
    elif due:
        note = (
            f"A slot, {format_utc(after.next_run_at)}, was already due before the edit: the scheduler "
            "dispatches it as the misfire policy says (below)."
        )
    elif after.paused:
        note = "No: the job is paused after the edit."
    elif after.next_run_at is None:
        note = "No: the job has no further slot."
    else:
        note = f"No: an edit never fires a past slot; the next run is {format_utc(after.next_run_at)}."
    return DueNow(due=due, because_of_edit=due and not was, note=note)


def _plural(n: int, exact: bool = True) -> str:
    return f"{'at least ' if not exact else ''}{n} slot{'' if n == 1 else 's'}"


def _past(job: Job, effects: planning.EditEffects, *, now: datetime) -> PastSlots:
    due = job.next_run_at
    if due is None or due > now:
        return PastSlots(0, False, None, None, 0, "none", "No slot is past and undispatched.")
    missed = planning.missed_slots(job, first=due, now=now)
    n, exact = missed.count, missed.count_exact
    span = f"{_plural(n, exact)} ({format_utc(missed.first)} to {format_utc(missed.last)})"

    def past(will_run: int, rule: str, note: str) -> PastSlots:
        return PastSlots(n, not exact, missed.first, missed.last, will_run, rule, note)

    if effects.schedule_changed:
        if job.paused:
            return past(
                0, "paused", f"{span} fell while paused: recorded as skipped (paused); none will run."
            )
        return past(
            0,
            "schedule_changed",
            f"{span} of the old schedule are due and not dispatched: the edit records them as missed "
            "(schedule_changed) and none will run; the new schedule starts at its next future slot.",
        )
    if effects.pause is not None:
        return past(
            0,
            "paused",
            f"{span} already due: pausing records them as a misfire (no run) and as skipped (paused).",
        )
    if effects.resume is not None:
        return past(0, "paused", f"{span} fell while paused: resuming without catch-up runs none of them.")
    if job.paused:
        return past(0, "paused", f"{span} fell while paused: what runs is decided by the resume's catch-up.")
    after = effects.job
    if now - due <= planning.starting_deadline(after):
        return past(n, "on_time", f"{span} due within the starting deadline: they fire as scheduled.")
    policy = after.misfire_policy
    if policy == MisfirePolicy.SKIP:
        runs, what = 0, "none runs"
    elif policy == MisfirePolicy.CATCH_UP:
        runs = min(n, after.max_catch_up)
        what = f"{runs} run{'' if runs == 1 else 's'}, oldest first (max_catch_up {after.max_catch_up})"
    else:
        runs, what = 1, "one run for the latest"
    return past(runs, "misfire_policy", f"{span} missed (a misfire): misfire policy {policy}, {what}.")


def preview_json(preview: EditPreview, *, shown: int = 100) -> dict[str, Any]:
    """The answer's parts that are not the job itself (lists capped at `shown`, with counts)."""
    effects, slots = preview.effects, preview.slots

    def listed(times: list[datetime]) -> dict:
        return {"count": len(times), "times": [format_utc(t) for t in times[:shown]]}

    past = preview.past
    return {
        "changes": preview.diff,
        "schedule_changed": effects.schedule_changed,
        "next_run_at": {
            "before": format_utc(preview.stored.next_run_at) if preview.stored.next_run_at else None,
            "after": format_utc(effects.job.next_run_at) if effects.job.next_run_at else None,
        },
        "fire_times": {
            "from": format_utc(preview.now),
            "to": format_utc(slots.until),
            "truncated": slots.truncated,
            "before": listed(slots.before),
            "after": listed(slots.after),
            "added": listed(slots.added),
            "removed": listed(slots.removed),
        },
        "due_now": {
            "due": preview.due_now.due,
            "because_of_edit": preview.due_now.because_of_edit,
            "note": preview.due_now.note,
        },
        "past_slots": {
            "count": past.count,
            "count_is_lower_bound": past.count_is_lower_bound,
            "first": format_utc(past.first) if past.first else None,
            "last": format_utc(past.last) if past.last else None,
            "will_run": past.will_run,
            "rule": past.rule,
            "note": past.note,
        },
        "ledger_ranges": [
            {
                "first_at": format_utc(r.first_at),
                "last_at": format_utc(r.last_at),
                "outcome": r.outcome,
                "reason": r.reason,
            }
            for r in effects.ranges
        ],
    }
