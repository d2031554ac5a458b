"""Runs in the admin (docs/CONTRACT.md, "Console"); this module registers the pages, each concept
has its own module:

- runs/admin/runs.py: the runs list and a run's read-only page;
- runs/admin/run_actions.py: replay and cancel, in bulk and from a run's page;
- runs/admin/dead_letter.py: the dead-letter queue;
- runs/admin/dashboard.py: the operations dashboard;
- runs/admin/html.py: a run's status badge, shared with the jobs admin;
- here: the executor nodes (read-only).
"""

from django.contrib import admin

from jobs.admin.base import ReadOnlyAdmin
from jobs.admin.display import moment_column
from runs.admin.dead_letter import DeadRunAdmin
from runs.admin.runs import JobRunAdmin
from runs.models import DeadRun, ExecutorNode, JobRun
from scheduler_project import liveness

admin.site.register(JobRun, JobRunAdmin)
admin.site.register(DeadRun, DeadRunAdmin)


@admin.register(ExecutorNode)
class ExecutorNodeAdmin(ReadOnlyAdmin):
    """Registered executors, read-only; alive by scheduler_project.liveness like schedulers."""

    list_display = (
        "node_id",
        "hostname",
        "pid",
        "concurrency",
        "in_flight",
        "last_claim",
        "heartbeat",
        "alive",
    )
    list_title = "Executor nodes"
    fields = (*list_display, "started")
    readonly_fields = fields
    started = moment_column("started_at", description="started")
    last_claim = moment_column("last_claim_at", description="last claim")
    heartbeat = moment_column("heartbeat_at", description="last heartbeat")

    def get_queryset(self, request):
        return liveness.with_alive(super().get_queryset(request))

    @admin.display(boolean=True, description="alive", ordering="alive")
    def alive(self, node: ExecutorNode) -> bool:
        return node.alive
