"""What every admin page of both apps shares: who acted (as the audit log names them)
and the read-only model page."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from jobs.audit import admin_actor


def actor_of(request: HttpRequest) -> str:
    return admin_actor(request.user)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written only by the system (audit entries, misfires, node heartbeats)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
