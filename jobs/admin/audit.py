"""The audit log in the admin: read-only, filterable by action, tenant, actor and time."""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html

from jobs.admin.base import ReadOnlyAdmin
from jobs.admin.display import in_zone, moment_column
from jobs.audit import shown_changes
from jobs.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    # An audit log nobody can edit: entries are written only by jobs.audit.record.
    list_display = ("when", "actor", "action_label", "job_name", "job_id", "short_changes", "tenant")
    list_filter = ("action", "tenant", "at")
    search_fields = ("actor", "job_name")
    search_help_text = "Actor (e.g. admin:alice, tenant:acme) or job name."
    list_select_related = ("tenant",)
    # No date_hierarchy: its "Dec. 4" links are Django's date format; the `at` filter
    # (today, past 7 days, this month) narrows by time instead.
    fields = ("when", "actor", "action_label", "tenant", "job_id", "job_name", "changes_pretty")
    readonly_fields = fields
    list_title = "Audit log"

    # An entry is about a job, but outlives it: UTC, like every moment without a job.
    when = moment_column("at", description="when")

    def object_title(self, entry: AuditEntry) -> str:
        about = entry.job_name or entry.job_id or f"tenant {entry.tenant}"
        return f"{entry.get_action_display()} of {about} by {entry.actor}, {in_zone(entry.at)}"

    @admin.display(description="action", ordering="action")
    def action_label(self, entry: AuditEntry) -> str:
        # The label every page uses for the API's value (docs/CONTRACT.md, "Words").
        return format_html(
            '{} <code style="font-size:10px">{}</code>', entry.get_action_display(), entry.action
        )

    @admin.display(description="changes")
    def short_changes(self, entry: AuditEntry) -> str:
        text = json.dumps(shown_changes(entry.changes), sort_keys=True)
        return text if len(text) <= 160 else text[:157] + "…"

    @admin.display(description="changes")
    def changes_pretty(self, entry: AuditEntry) -> str:
        return format_html(
            '<pre style="white-space:pre-wrap">{}</pre>', json.dumps(shown_changes(entry.changes), indent=2)
        )
