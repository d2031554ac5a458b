"""The admin job form as a browser posts it: every field, overridable one by one."""

from __future__ import annotations

import json

from jobs.models import Tenant

HTTP_TARGET = {"type": "http", "url": "https://example.com/hook"}


def job_form_data(tenant: Tenant, *, target: dict | str | None = None, **overrides) -> dict:
    """`target` as a dict (encoded here) or as the raw text a user typed (kept as is)."""
    data = {
        "tenant": tenant.pk,
        "name": "from admin",
        "cron_expr": "*/5 * * * *",
        "time_zone": "UTC",
        "interval_seconds": "",
        "run_at_0": "",
        "run_at_1": "",
        "start_at_0": "",
        "start_at_1": "",
        "end_at_0": "",
        "end_at_1": "",
        "target": target if isinstance(target, str) else json.dumps(target or HTTP_TARGET),
        "misfire_policy": "run_once",
        "max_catch_up": "100",
        "starting_deadline_seconds": "",
        "overlap_policy": "skip",
        "max_attempts": "5",
        "retry_backoff_seconds": "10",
        "retry_backoff_cap_seconds": "3600",
        "lease_seconds": "30",
        "priority": "0",
        "alert_after_failures": "3",
    }
    data.update(overrides)
    return data
