from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from scheduler_project.sharding import PartitionKeyed

MAX_RUNS_PER_MINUTE = 1_000_000


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    max_concurrency = models.PositiveIntegerField(
        default=10, help_text="Most runs of this tenant executing at the same moment."
    )
    # Fair share: below their caps, tenants with due runs get executor slots in
    # proportion to their weight (see runs/execution/claims.py, the claim).
    weight = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1)],
        help_text="Share of executor slots relative to other tenants with due runs.",
    )
    # Dispatch rate limit (jobs/dispatch/rate_limits.py): runs beyond it in a minute are not
    # dropped, their not_before moves to a later minute. NULL = unlimited.
    max_runs_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_RUNS_PER_MINUTE)],
        help_text="Most scheduled runs of this tenant dispatched to start in one minute "
        "(the excess starts in later minutes). Empty: unlimited.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # The Standard Webhooks secret that signs the tenant's HTTP calls
    # (runs/execution/signing.py); during a rotation's overlap the previous one signs
    # too, until `previous_signing_secret_until`. Write-only: shown once, by the
    # command, the console message or the API answer that created it
    # (jobs/tenant_services.py); not editable, so no admin form or page carries it.
    signing_secret = models.CharField(max_length=100, editable=False)
    previous_signing_secret = models.CharField(max_length=100, blank=True, default="", editable=False)
    previous_signing_secret_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "tenants"
        ordering = ["slug"]
        constraints = [
            # The claim divides by it.
            models.CheckConstraint(name="tenants_weight_positive", condition=models.Q(weight__gte=1)),
            # Every call is signed: no tenant without a secret.
            models.CheckConstraint(
                name="tenants_signing_secret_set", condition=models.Q(signing_secret__startswith="whsec_")
            ),
            models.CheckConstraint(
                name="tenants_max_runs_per_minute_range",
                condition=models.Q(max_runs_per_minute__gte=1, max_runs_per_minute__lte=MAX_RUNS_PER_MINUTE),
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class TenantDispatchWindow(models.Model):
    """Runs of a rate-limited tenant dispatched to start in one minute (jobs/dispatch/rate_limits.py).

    Shared by every scheduler: written only in dispatch transactions, under the row of
    the tenant's lock window (`window_start = '-infinity'`), which serialises the
    tenant's allocations. Keyed and (on Citus) distributed by tenant, so an update locks
    rows of one shard only and never the tenants reference table. No foreign key: the
    rows are a minute's bookkeeping, pruned once their minute is past.
    """

    pk = models.CompositePrimaryKey("tenant_id", "window_start")
    tenant_id = models.BigIntegerField()
    window_start = models.DateTimeField()
    runs = models.IntegerField(default=0)

    class Meta:
        db_table = "tenant_dispatch_windows"

    def __str__(self) -> str:
        return f"{self.tenant_id}@{self.window_start}: {self.runs}"


class ApiToken(models.Model):
    """Only a SHA-256 of the token is stored; the clear token is shown once at creation."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to tell tokens apart.")
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        db_table = "api_tokens"

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.prefix}…"


class MisfirePolicy(models.TextChoices):
    RUN_ONCE = "run_once", "Run once (latest missed slot)"
    SKIP = "skip", "Skip missed slots"
    CATCH_UP = "catch_up", "Catch up (one run per missed slot)"


class OverlapPolicy(models.TextChoices):
    SKIP = "skip", "Skip while a run is active"
    BUFFER_ONE = "buffer_one", "Buffer one"
    ALLOW = "allow", "Allow concurrent runs"
    CANCEL_PREVIOUS = "cancel_previous", "Cancel the previous run"


class TriggerType(models.TextChoices):
    """A job's `trigger_type` in the API, with the label every console page shows for it."""

    CRON = "cron", "Cron"
    INTERVAL = "interval", "Interval"
    RUN_AT = "run_at", "One time"


# The API's name of each job field whose column is named otherwise. The one home of the
# mapping: the job serializer's `source=` attributes must agree (tests/test_audit.py
# checks), and the audit log writes and shows `changes` by these names (jobs.audit).
API_FIELD_NAMES = {"cron_expr": "cron", "time_zone": "timezone"}


class Job(PartitionKeyed):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="jobs")
    name = models.CharField(max_length=200)

    # Exactly one trigger is set; the check constraint below keeps it so.
    cron_expr = models.CharField(max_length=200, blank=True, default="")
    time_zone = models.CharField(max_length=64, default="UTC")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)
    # {"repeated": "first"|"last"|"both", "missing": "shift"|"skip"}, keys optional: an
    # unset key keeps Debian cron's rule for the job's kind (jobs.schedule.effective_dst_policy).
    dst_policy = models.JSONField(default=dict, blank=True)

    target = models.JSONField()
    # The version of `target` its runs reference (JobTarget): a new one with every change
    # of the target, written in the same transaction as the job (jobs/services.py).
    target_version = models.IntegerField(default=1, editable=False)

    misfire_policy = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.RUN_ONCE
    )
    max_catch_up = models.PositiveIntegerField(default=100)
    overlap_policy = models.CharField(
        max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.SKIP
    )
    max_attempts = models.PositiveIntegerField(default=5, validators=[MinValueValidator(1)])
    retry_backoff_seconds = models.PositiveIntegerField(default=10)
    retry_backoff_cap_seconds = models.PositiveIntegerField(default=3600)
    lease_seconds = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    priority = models.PositiveSmallIntegerField(
        default=0, validators=[MinValueValidator(0), MaxValueValidator(9)]
    )
    # Runs start up to this many seconds after their slot (a stable per-slot offset,
    # jobs/schedule/jitter.py); the slot itself, and so the run key, does not move.
    jitter_seconds = models.PositiveIntegerField(default=0)
    # A slot found later than this is a misfire (Kubernetes' startingDeadlineSeconds);
    # NULL: SCHEDULER_MISFIRE_THRESHOLD_SECONDS. jobs.dispatch.planning.starting_deadline is the
    # one reading of it.
    starting_deadline_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )

    partition_id = models.PositiveSmallIntegerField(editable=False)
    next_run_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    # When the current schedule took effect (creation or the last schedule edit): the
    # occurrence ledger lists this schedule's slots from here on. NULL = created_at.
    schedule_since = models.DateTimeField(null=True, blank=True, editable=False)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Health: written by the executors' outcome statement (runs.execution.queries.COMPLETE),
    # never by Django; a run's final or retried attempt counts, a hand-back does not.
    last_outcome = models.CharField(max_length=16, blank=True, default="", editable=False)
    last_success_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_failure_at = models.DateTimeField(null=True, blank=True, editable=False)
    consecutive_failures = models.PositiveIntegerField(default=0, editable=False)
    alert_after_failures = models.PositiveIntegerField(
        default=3, help_text="Alert when this many attempts in a row have failed."
    )
    # Alert bookkeeping (jobs.alerts): the overdue slot already alerted on, and whether
    # the current failure streak was.
    overdue_alerted_for = models.DateTimeField(null=True, blank=True, editable=False)
    failure_alerted = models.BooleanField(default=False, editable=False)

    class Meta:
        db_table = "jobs"
        ordering = ["-created_at"]
        indexes = [
            # The dispatch query: due jobs of owned partitions, oldest first.
            models.Index(
                fields=["partition_id", "next_run_at"],
                name="jobs_due_idx",
                condition=models.Q(paused=False),
            ),
            models.Index(fields=["tenant", "created_at"], name="jobs_tenant_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                name="jobs_exactly_one_trigger",
                condition=(
                    (
                        models.Q(cron_expr__gt="")
                        & models.Q(interval_seconds__isnull=True)
                        & models.Q(run_at__isnull=True)
                    )
                    | (
                        models.Q(cron_expr="")
                        & models.Q(interval_seconds__isnull=False)
                        & models.Q(run_at__isnull=True)
                    )
                    | (
                        models.Q(cron_expr="")
                        & models.Q(interval_seconds__isnull=True)
                        & models.Q(run_at__isnull=False)
                    )
                ),
            ),
            models.CheckConstraint(name="jobs_priority_range", condition=models.Q(priority__lte=9)),
            models.CheckConstraint(
                name="jobs_interval_positive", condition=models.Q(interval_seconds__gte=1)
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def trigger_type(self) -> str:
        if self.cron_expr:
            return TriggerType.CRON.value
        if self.interval_seconds is not None:
            return TriggerType.INTERVAL.value
        return TriggerType.RUN_AT.value


class JobTargetManager(models.Manager["JobTarget"]):
    def create_for_new_jobs(self, jobs: Iterable[Job], *, batch_size: int | None = None) -> list[JobTarget]:
        """Write each unsaved job's current target version; create the jobs after.

        The versions go first because a running scheduler dispatches a job the moment
        it is committed, and the run it writes must find its version when claimed.
        """
        return self.bulk_create([self.model.current(job) for job in jobs], batch_size=batch_size)


class JobTarget(models.Model):
    """One immutable version of a job's target: what its runs execute.

    A run references (job_id, target_version) instead of carrying a copy: the target
    (URL, headers, body) was most of a run row's bytes (docs/decisions/0076-job-target-versions.md).
    A version is never changed once written, so a run, its retries and its replays
    execute the target they were created with whatever later edits do; the claim joins
    it in (runs/execution/queries.py). Co-located with the job on Citus (same
    partition_id). No foreign key: jobs/services.py deletes a job's versions with it.
    """

    pk = models.CompositePrimaryKey("partition_id", "job_id", "version")
    partition_id = models.PositiveSmallIntegerField()
    job_id = models.UUIDField()
    version = models.PositiveIntegerField()
    target = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    objects = JobTargetManager()

    class Meta:
        db_table = "job_targets"

    def __str__(self) -> str:
        return f"{self.job_id} target v{self.version}"

    @classmethod
    def current(cls, job: Job) -> JobTarget:
        """The version row of the job's target as it is now (unsaved)."""
        return cls(
            partition_id=job.partition_id, job_id=job.id, version=job.target_version, target=job.target
        )


class Misfire(PartitionKeyed):
    """A scheduler found a job's next_run_at older than the misfire threshold."""

    # The database's foreign key is (partition_id, job_id) -> jobs (partition_id, id)
    # (jobs migration 0010): Django's own would reference jobs (id) alone.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, db_constraint=False, related_name="misfires")
    partition_id = models.PositiveSmallIntegerField(editable=False, help_text="The job's.")
    detected_at = models.DateTimeField(auto_now_add=True)
    policy = models.CharField(max_length=16, choices=MisfirePolicy.choices)
    missed_count = models.PositiveIntegerField()
    count_is_lower_bound = models.BooleanField(
        default=False, help_text="The backlog was too long to count slot by slot: at least missed_count."
    )
    first_missed_at = models.DateTimeField()
    last_missed_at = models.DateTimeField()
    runs_created = models.PositiveIntegerField()

    class Meta:
        db_table = "job_misfires"
        ordering = ["-detected_at"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.missed_count} missed ({self.policy})"


class SlotOutcome(models.TextChoices):
    SKIPPED = "skipped"
    MISSED = "missed"


class SlotReason(models.TextChoices):
    PAUSED = "paused"
    MISFIRE_SKIP = "misfire_skip"
    MISFIRE_COALESCED = "misfire_coalesced"
    CATCH_UP_LIMIT = "catch_up_limit"
    SCHEDULE_CHANGED = "schedule_changed"


class SlotRange(PartitionKeyed):
    """Slots of a job in [first_at, last_at] that got no run, and why: one row per range.

    The occurrence ledger expands a range into its slots on read, with the schedule
    the job had when the range was recorded (copied here), so a later edit cannot
    reinterpret it. Run rows are the fired slots; they take precedence over a range.
    """

    # Database foreign key (partition_id, job_id), as Misfire's.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, db_constraint=False, related_name="slot_ranges")
    partition_id = models.PositiveSmallIntegerField(editable=False, help_text="The job's.")
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    outcome = models.CharField(max_length=8, choices=SlotOutcome.choices)
    reason = models.CharField(max_length=20, choices=SlotReason.choices)
    cron_expr = models.CharField(max_length=200, blank=True, default="")
    time_zone = models.CharField(max_length=64, default="UTC")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)
    dst_policy = models.JSONField(default=dict, blank=True)
    anchor = models.DateTimeField(help_text="A slot of the schedule (the interval grid's anchor).")
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "job_slot_ranges"
        # job_id, not job: ordering by the relation would join jobs on id alone, a join
        # across shards on Citus (and a pointless one anywhere).
        ordering = ["job_id", "first_at"]
        indexes = [models.Index(fields=["job", "last_at"], name="slot_ranges_job_last_idx")]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.outcome}/{self.reason} {self.first_at}..{self.last_at}"


class SchedulerNode(models.Model):
    """Heartbeat row of a live scheduler; the live set decides each node's fair share."""

    node_id = models.CharField(max_length=100, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    partitions = models.JSONField(default=list)

    class Meta:
        db_table = "scheduler_nodes"
        ordering = ["node_id"]

    def __str__(self) -> str:
        return self.node_id


class AuditAction(models.TextChoices):
    CREATE = "create", "Create"
    UPDATE = "update", "Edit"
    PAUSE = "pause", "Pause"
    RESUME = "resume", "Resume"
    TRIGGER = "trigger", "Trigger"
    BACKFILL = "backfill", "Backfill"
    REPLAY = "replay", "Replay"
    CANCEL = "cancel", "Cancel"
    DELETE = "delete", "Delete"
    # A tenant's own credentials: entries with no job.
    ISSUE_TOKEN = "issue_token", "Issue API token"
    REVOKE_TOKEN = "revoke_token", "Revoke API token"
    ROTATE_SIGNING_SECRET = "rotate_secret", "Rotate signing secret"


class AuditEntry(models.Model):
    """Who changed what, written by jobs.audit.record in the transaction of the change.

    `job_id` is a plain UUID, not a foreign key: the entry of a deletion must outlive
    the job it describes; it is null for an entry about the tenant's own credentials
    (tokens, signing secret). Secret header values never reach `changes` (redacted
    first), and no token or secret ever does.
    """

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="audit_entries")
    job_id = models.UUIDField(null=True, blank=True)
    job_name = models.CharField(max_length=200, blank=True)
    actor = models.CharField(
        max_length=200, help_text='"admin:<username>", "tenant:<slug> token:<prefix>", or "system".'
    )
    action = models.CharField(max_length=16, choices=AuditAction.choices)
    changes = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)

    class Meta:
        db_table = "audit_entries"
        ordering = ["-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            # The API's pages: a tenant's entries newest first, optionally one job's.
            models.Index(fields=["tenant", "-id"], name="audit_tenant_idx"),
            models.Index(fields=["job_id", "-id"], name="audit_job_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.job_name or self.job_id}"
