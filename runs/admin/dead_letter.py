"""The dead-letter queue in the admin: dead runs only, replayable in bulk or one by one
from its row."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from runs.admin.runs import JobRunAdmin
from runs.models import JobRun, RunStatus


class DeadRunAdmin(JobRunAdmin):
    """The dead-letter queue: dead runs only, newest first, replayable in bulk."""

    list_title = "Dead-letter queue"

    list_display = (
        "job_name",
        "scheduled",
        "tenant",
        "attempt_text",
        "result_code",
        "short_error",
        "finished",
        "replay_button",
    )
    list_filter = ("tenant", "trigger")
    actions = ("replay_selected", "replay_selected_dry_run")

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).filter(status=RunStatus.DEAD)

    @admin.display(description="")
    def replay_button(self, run: JobRun) -> str:
        # The run's confirmation page; its Yes brings the operator back to this queue.
        url = reverse("admin:runs_deadrun_replay", args=[run.pk]) + "?from=list"
        return format_html('<a class="button" href="{}">Replay…</a>', url)

    @admin.display(description="last error")
    def short_error(self, run: JobRun) -> str:
        text = run.last_error or ""
        return text if len(text) <= 120 else text[:117] + "…"
