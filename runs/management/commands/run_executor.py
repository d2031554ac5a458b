from django.core.management.base import BaseCommand

from runs.executor import Executor


class Command(BaseCommand):
    help = "Claim queued runs and execute them (HTTP calls and registered tasks) until stopped."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--once", action="store_true", help="Claim one batch, run it to the end, exit.")
        parser.add_argument("--concurrency", type=int, default=32, help="Most runs in flight (default 32).")
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=10.0,
            help="On SIGTERM, how long in-flight runs may finish before they are handed back (default 10).",
        )

    def handle(self, *args, once: bool, concurrency: int, grace_seconds: float, **options) -> None:
        executor = Executor.from_settings(
            concurrency=max(1, concurrency), grace_seconds=max(0.0, grace_seconds)
        )
        executor.install_signal_handlers()
        executor.run(once=once)
