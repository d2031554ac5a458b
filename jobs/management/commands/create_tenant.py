from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from jobs.audit import SYSTEM
from jobs.models import Tenant
from jobs.tenant_services import create_tenant, issue_token, set_rate_limit

# Spellings of "no limit" for --max-runs-per-minute.
_OFF = ("off", "none", "unlimited")


def rate_limit(text: str) -> int | None:
    """--max-runs-per-minute: a whole number, or off. The range is the service's to judge."""
    if text.strip().lower() in _OFF:
        return None
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"--max-runs-per-minute: '{text}' is not a whole number or 'off'") from None


class Command(BaseCommand):
    help = (
        "Create a tenant (or a new token for an existing one with --new-token, or change an existing "
        "one's --max-runs-per-minute with --update). A new tenant's signing secret is printed once, "
        "as 'signing secret: whsec_...'; a token, when issued, is the last line."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--max-concurrency", type=int, default=10)
        parser.add_argument(
            "--max-runs-per-minute",
            default=None,
            help="dispatch rate limit (1..1000000 scheduled runs starting per minute; the excess "
            "starts in later minutes), or 'off' (the default)",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--new-token", action="store_true", help="issue another token for an existing tenant"
        )
        mode.add_argument(
            "--update", action="store_true", help="set --max-runs-per-minute of an existing tenant"
        )

    def handle(self, slug, name, max_concurrency, max_runs_per_minute, new_token, update, **options):
        if max_concurrency < 1:
            raise CommandError("--max-concurrency must be at least 1")
        limit = rate_limit(max_runs_per_minute) if max_runs_per_minute is not None else None
        if new_token or update:
            tenant = Tenant.objects.filter(slug=slug).first()
            if tenant is None:
                raise CommandError(f"no tenant '{slug}'")
        if update:
            if max_runs_per_minute is None:
                raise CommandError("--update needs --max-runs-per-minute (a number, or off)")
            tenant = self._checked(set_rate_limit, tenant=tenant, max_runs_per_minute=limit)
            self.stdout.write(
                f"tenant {tenant.slug}: max_runs_per_minute={tenant.max_runs_per_minute or 'off'}"
            )
            return
        if new_token:
            token = issue_token(tenant=tenant, label="create_tenant --new-token", actor=SYSTEM)
        else:
            try:
                tenant, token = self._checked(
                    create_tenant,
                    slug=slug,
                    name=name,
                    max_concurrency=max_concurrency,
                    max_runs_per_minute=limit,
                )
            except IntegrityError as exc:
                raise CommandError(
                    f"tenant '{slug}' already exists (use --new-token for another token)"
                ) from exc
            # Shown this once: it signs the tenant's HTTP calls (README, "Verifying calls").
            self.stdout.write(f"signing secret: {tenant.signing_secret}")
        self.stdout.write(
            f"tenant {tenant.slug} (max_concurrency={tenant.max_concurrency}, "
            f"max_runs_per_minute={tenant.max_runs_per_minute or 'off'}); API token:"
        )
        self.stdout.write(token)

    @staticmethod
    def _checked(service, **kwargs):
        try:
            return service(**kwargs)
        except ValidationError as exc:
            messages = "; ".join(
                f"--{field.replace('_', '-')}: {' '.join(errs)}" for field, errs in exc.message_dict.items()
            )
            raise CommandError(messages) from exc
