"""The console's rules for moments and durations (jobs/admin/display.py) as template
filters, for the pages written as templates (the dashboard, the admin home), and the
admin home's recent changes from the audit log."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.contrib import admin
from django.utils import timezone
from django.utils.safestring import SafeString

from jobs.admin.display import duration_text, moment_html
from jobs.audit import shown_changes
from jobs.models import AuditEntry
from runs import selectors

register = template.Library()


@register.filter
def moment(value: datetime | None, zone: str | None = None) -> SafeString | str:
    """`{{ run.started_at|moment }}` (UTC) or `{{ slot|moment:job.time_zone }}`."""
    return moment_html(value, now=timezone.now(), zone=zone or None)


@register.filter
def duration(seconds: float | None) -> str:
    """`{{ node.heartbeat_age_seconds|duration }}`: "850 ms", "12.4 s", "3 min 5 s"."""
    return duration_text(None if seconds is None else float(seconds))


@register.filter
def changed_fields(changes: object) -> str:
    """An edit's changed fields by the API's names: "cron, timezone"."""
    shown = shown_changes(changes)
    return ", ".join(shown) if isinstance(shown, dict) else ""


@register.simple_tag(takes_context=True)
def recent_changes(context, limit: int = 10) -> list[AuditEntry] | None:
    """The audit log's newest entries for the admin home, or None for a user who may not
    read the audit log (the same permission as its list)."""
    request = context["request"]
    audit = admin.site.get_model_admin(AuditEntry) if admin.site.is_registered(AuditEntry) else None
    if audit is None or not audit.has_view_or_change_permission(request):
        return None
    return list(selectors.recent_changes(limit=limit))
