"""The audit log in the admin: read-only, filterable by action, tenant, actor and time."""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html

from jobs.admin.base import ReadOnlyAdmin
from jobs.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    # An audit log nobody can edit: entries are written only by jobs.audit.record.
    list_display = ("at", "actor", "action", "job_name", "job_id", "short_changes", "tenant")
    list_filter = ("action", "tenant", "at")
    search_fields = ("actor", "job_name")
    search_help_text = "Actor (e.g. admin:alice, tenant:acme) or job name."
    list_select_related = ("tenant",)
    date_hierarchy = "at"
    fields = ("at", "actor", "action", "tenant", "job_id", "job_name", "changes_pretty")
    readonly_fields = fields

    @admin.display(description="changes")
    def short_changes(self, entry: AuditEntry) -> str:
        text = json.dumps(entry.changes, sort_keys=True)
        return text if len(text) <= 160 else text[:157] + "…"

    @admin.display(description="changes")
    def changes_pretty(self, entry: AuditEntry) -> str:
        return format_html('<pre style="white-space:pre-wrap">{}</pre>', json.dumps(entry.changes, indent=2))
