from django.core.management.base import BaseCommand

from jobs.dispatch.scheduler import Scheduler


class Command(BaseCommand):
    help = "Run the scheduler: lease a fair share of partitions and dispatch their due jobs."

    def add_arguments(self, parser):
        parser.add_argument(
            "--once", action="store_true", help="one pass over the owned partitions, then release and exit"
        )

    def handle(self, *args, once: bool = False, **options):
        loop = Scheduler()
        loop.install_signal_handlers()
        loop.run(once=once)
