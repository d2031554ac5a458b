from django.core.management.base import BaseCommand, CommandError

from runs.execution.executor import Executor


class Command(BaseCommand):
    help = "Claim queued runs and execute them (HTTP calls and registered tasks) until stopped."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--once", action="store_true", help="Claim one batch, run it to the end, exit.")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=32,
            help="Most target calls in flight at once (default 32).",
        )
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=10.0,
            help="On SIGTERM, how long in-flight runs may finish before they are handed back (default 10).",
        )

    def handle(self, *args, once: bool, concurrency: int, grace_seconds: float, **options) -> None:
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        if grace_seconds < 0:
            raise CommandError("--grace-seconds cannot be negative")
        executor = Executor.from_settings(concurrency=concurrency, grace_seconds=grace_seconds)
        executor.install_signal_handlers()
        executor.run(once=once)
