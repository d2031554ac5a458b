"""What every admin page of both apps shares: who acted (as the audit log names them),
page titles an operator would write, and the read-only model page."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.text import capfirst

from jobs.audit import admin_actor


def actor_of(request: HttpRequest) -> str:
    return admin_actor(request.user)


# The context key by which change_view asks render_change_form for the object's title.
_OBJECT_TITLE = "_console_object_title"


class ConsoleTitles:
    """A list page titled by what it lists ("Runs", "Dead-letter queue"), and an object's
    page by the object (`object_title`), instead of Django's "Select job run to change"
    and "Change job run". A view's own `title` in extra_context still wins."""

    list_title = ""

    def object_title(self, obj) -> str:
        return f"{capfirst(self.opts.verbose_name)} {obj}"

    def changelist_view(self, request: HttpRequest, extra_context=None):
        title = self.list_title or capfirst(self.opts.verbose_name_plural)
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        # Titled in render_change_form, by the object Django loads for the form: a load
        # here for the title would read the row twice per page.
        own_title = "title" in (extra_context or {})
        return super().change_view(
            request, object_id, form_url, {_OBJECT_TITLE: not own_title, **(extra_context or {})}
        )

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if context.pop(_OBJECT_TITLE, False) and obj is not None:
            context.update(title=self.object_title(obj), subtitle=None)
        return super().render_change_form(request, context, add, change, form_url, obj)


class ReadOnlyAdmin(ConsoleTitles, admin.ModelAdmin):
    """Rows written only by the system (audit entries, misfires, node heartbeats)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
