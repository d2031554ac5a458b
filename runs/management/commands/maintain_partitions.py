from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection

from runs.day_partitions import maintain
from runs.execution.breakers import prune_idle


class Command(BaseCommand):
    help = (
        "Create the day partitions of job_runs and run_history ahead, drop days older than"
        " RUN_RETENTION_DAYS and"
        " prune idle circuit-breaker rows."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days-ahead", type=int, default=7)

    def handle(self, days_ahead, **options):
        report = maintain(days_ahead=days_ahead, retention_days=settings.RUN_RETENTION_DAYS)
        with connection.cursor() as cursor:
            pruned = prune_idle(cursor)
        self.stdout.write(
            f"created {len(report.created)} partition(s), dropped {len(report.dropped)}, "
            f"moved {report.moved_rows} row(s) out of the default partition, "
            f"pruned {pruned} idle circuit-breaker row(s)"
        )
