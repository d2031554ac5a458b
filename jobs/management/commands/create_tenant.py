from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from jobs.models import Tenant
from jobs.services import create_tenant, issue_token


class Command(BaseCommand):
    help = (
        "Create a tenant (or a new token for an existing one with --new-token). The token is the last line."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--max-concurrency", type=int, default=10)
        parser.add_argument(
            "--new-token", action="store_true", help="issue another token for an existing tenant"
        )

    def handle(self, slug, name, max_concurrency, new_token, **options):
        if max_concurrency < 1:
            raise CommandError("--max-concurrency must be at least 1")
        if new_token:
            tenant = Tenant.objects.filter(slug=slug).first()
            if tenant is None:
                raise CommandError(f"no tenant '{slug}'")
            token = issue_token(tenant=tenant, label="create_tenant --new-token")
        else:
            try:
                tenant, token = create_tenant(slug=slug, name=name, max_concurrency=max_concurrency)
            except IntegrityError as exc:
                raise CommandError(
                    f"tenant '{slug}' already exists (use --new-token for another token)"
                ) from exc
        self.stdout.write(f"tenant {tenant.slug} (max_concurrency={tenant.max_concurrency}); API token:")
        self.stdout.write(token)
