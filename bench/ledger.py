"""Occurrence ledger: a year of a minutely job (525,600 slots) listed page by page.

    DATABASE_URL=... .venv/bin/python bench/ledger.py [--page-size 1000]

The history is what a long-lived job accumulates: mostly paused stretches (stored as
a handful of ledger ranges), a few thousand runs, and the slots in between. Each page
is read through `jobs.ledger.occurrences`, the function the API calls, and timed.
Runs on a scratch database of the same cluster with RUN_RETENTION_DAYS=400 (the
ledger speaks for the retention window). Prints a Markdown table; not a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dispatch import ROOT, ensure_database

PAUSES = 12  # one pause a month, each a ranged row
RUN_BLOCK = 400  # minutes of fired runs between pauses


def seed(*, now) -> object:
    from jobs.dispatch.planning import run_for, skipped_range
    from jobs.models import Job, JobTarget, SlotReason, Tenant
    from runs.enqueue import enqueue_runs
    from runs.execution.signing import new_secret

    tenant, _ = Tenant.objects.get_or_create(
        slug="bench-ledger", defaults={"name": "bench", "signing_secret": new_secret()}
    )
    Job.objects.filter(tenant=tenant).delete()
    start = now.replace(second=0, microsecond=0) - timedelta(days=365)
    job = Job(
        id=uuid.uuid4(),
        tenant=tenant,
        name="a year of minutes",
        cron_expr="* * * * *",
        target={"type": "task", "name": "noop", "kwargs": {}},
        partition_id=0,
        # The current minute is due and not dispatched yet: it lists as pending.
        next_run_at=now.replace(second=0, microsecond=0),
    )
    job.save(force_insert=True)
    JobTarget.current(job).save(force_insert=True)
    Job.objects.filter(pk=job.pk).update(created_at=start, schedule_since=start)
    job.refresh_from_db()
    month = timedelta(days=365) / PAUSES
    ranges, runs = [], 0
    for k in range(PAUSES):
        block = start + k * month
        fired = [block + timedelta(minutes=m) for m in range(RUN_BLOCK)]
        enqueue_runs([run_for(job, scheduled_at=t, trigger="schedule", overlap_check=False) for t in fired])
        runs += len(fired)
        paused_to = min(block + month - timedelta(minutes=1), job.next_run_at - timedelta(minutes=1))
        ranges.append(
            skipped_range(
                job, first=fired[-1] + timedelta(minutes=1), last=paused_to, reason=SlotReason.PAUSED
            )
        )
    from jobs.models import SlotRange

    SlotRange.objects.bulk_create([r for r in ranges if r is not None])
    return job, start, runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--db", default="cronyard_bench_ledger")
    args = parser.parse_args()
    url = ensure_database(os.environ["DATABASE_URL"], args.db)
    os.environ.update(DATABASE_URL=url, RUN_RETENTION_DAYS="400")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from jobs import ledger
    from scheduler_project import db

    now = db.now()
    job, start, runs = seed(now=now)
    after, pages, total, seen = None, [], 0, set()
    kinds: dict[str, int] = {}
    while True:
        t = time.perf_counter()
        items, more = ledger.occurrences(
            job=job, start=start, end=now, now=db.now(), after=after, limit=args.page_size
        )
        pages.append((time.perf_counter() - t) * 1000)
        for item in items:
            assert item.scheduled_at not in seen, "an occurrence listed twice"
            seen.add(item.scheduled_at)
            kinds[item.outcome] = kinds.get(item.outcome, 0) + 1
            if item.outcome == "missed" and item.reason is None:
                print(f"unexplained slot: {item.scheduled_at.isoformat()} (job created {start.isoformat()})")
        total += len(items)
        if not more:
            break
        after = items[-1].scheduled_at
    p = sorted(pages)
    print("| slots listed | runs (fired) | pages | page size | p50 ms | p99 ms | max ms | outcomes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    print(
        f"| {total} | {runs} | {len(pages)} | {args.page_size} | {statistics.median(p):.1f} "
        f"| {p[int(len(p) * 0.99) - 1]:.1f} | {p[-1]:.1f} | {kinds} |"
    )


if __name__ == "__main__":
    main()
