from django.db import models

from runs import attempts
from runs.keys import format_utc
from scheduler_project.sharding import PartitionKeyed


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RETRYING)
FINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.DEAD, RunStatus.SKIPPED, RunStatus.CANCELLED)


class RunTrigger(models.TextChoices):
    SCHEDULE = "schedule"
    MANUAL = "manual"
    BACKFILL = "backfill"
    REPLAY = "replay"
    CATCH_UP = "catch_up", "Catch-up"


class RunKeyColumns(models.Model):
    """The columns that find a run: its id, its run key (job, scheduled time, partition)
    and its tenant."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey("jobs.Job", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    scheduled_at = models.DateTimeField()
    tenant = models.ForeignKey(
        "jobs.Tenant", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    partition_id = models.PositiveSmallIntegerField()

    class Meta:
        abstract = True


class RunColumns(RunKeyColumns):
    """The columns of a run: job_runs holds them all, the view `runs` gives them all back
    (run_history keeps fewer: runs/history.py)."""

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    trigger = models.CharField(max_length=16, choices=RunTrigger.choices, default=RunTrigger.SCHEDULE)
    priority = models.PositiveSmallIntegerField(default=0)
    attempt = models.PositiveIntegerField(default=0)
    not_before = models.DateTimeField()
    lease_until = models.DateTimeField(null=True, blank=True)
    owner = models.CharField(max_length=100, blank=True, default="")

    # What executing needs, so runs never read the jobs table: the job's target as the
    # immutable version `target_version` (jobs.models.JobTarget, which the claim joins
    # in), and the policies copied. `target` holds a copy only in runs written before
    # target versions existed (target_version NULL); runs.selectors.target_of reads both.
    target = models.JSONField(null=True, blank=True, editable=False)
    target_version = models.IntegerField(null=True, blank=True, editable=False)
    job_name = models.CharField(max_length=200, blank=True, default="")
    overlap_policy = models.CharField(max_length=16, default="skip")
    max_attempts = models.PositiveIntegerField(default=5)
    retry_backoff_seconds = models.PositiveIntegerField(default=10)
    retry_backoff_cap_seconds = models.PositiveIntegerField(default=3600)
    lease_seconds = models.PositiveIntegerField(default=30)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result_code = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # One entry per attempt but a first-attempt success, appended under the attempt's
    # fence: an array in runs.attempts.FIELDS order (older rows: objects). Read it with
    # runs.attempts.history.
    attempts = models.JSONField(default=list, blank=True)
    # Times a claim put the run back unsent (its host's circuit open, or its retry
    # budget spent): those claims used no attempt, so attempts used = attempt - deferrals.
    deferrals = models.PositiveIntegerField(db_default=0, editable=False)
    deferred_since = models.DateTimeField(null=True, blank=True, editable=False)
    # Set by dispatch when the tenant's max_runs_per_minute pushed not_before to a later
    # minute (jobs/dispatch/rate_limits.py): the occurrence ledger and the run detail say so.
    rate_limited_to = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        # Page titles, breadcrumbs and the admin log: the job's name reads, its id does not.
        return f"{self.job_name or self.job_id} @ {format_utc(self.scheduled_at)}"

    @property
    def attempts_used(self) -> int:
        """Attempts this run has used (`attempt` is the claim's fence, not this)."""
        return attempts.used(attempt=self.attempt, deferrals=self.deferrals)

    @property
    def run_key(self) -> str:
        from runs.keys import run_key

        return run_key(self.job_id, self.scheduled_at)


class JobRun(RunColumns):
    """One occurrence of a job, wherever its row is: every reader's model (read-only).

    A run's row lives in job_runs while it is open, and there for good when it ends any
    other way than a success (dead, cancelled, skipped); a success moves it to
    run_history, written once (docs/decisions/0085-run-history.md; on Citus a few seconds
    after its outcome, 0087-citus-history-moves.md). This model reads
    the view `runs`, their union (runs migrations 0023, 0024); writers name the tables:
    JobRunRow for the services' locked writes, SQL for everything else.

    Its identity is (job_id, scheduled_at), enforced per table as (partition_id, job_id,
    scheduled_at) (a job's runs share its partition_id, so the two say the same; the
    database key must contain Citus's distribution column), and across the two tables by
    runs.enqueue. `id` is a surrogate only because Django 5.2's admin cannot register
    models with a CompositePrimaryKey (see docs/decisions/0001-run-identity.md).
    The foreign keys carry no database constraint: runs outlive nothing but are
    deleted by the job service in bulk, and a partitioned table with millions of
    rows must not be scanned on every job delete.
    """

    job = models.ForeignKey("jobs.Job", on_delete=models.DO_NOTHING, db_constraint=False, related_name="runs")
    tenant = models.ForeignKey(
        "jobs.Tenant", on_delete=models.DO_NOTHING, db_constraint=False, related_name="runs"
    )

    class Meta:
        managed = False
        db_table = "runs"
        # "Runs" on the console's home, in titles and counts: Django's default is "job runs".
        verbose_name = "run"
        verbose_name_plural = "runs"
        ordering = ["-scheduled_at"]


class RunHistoryRow(PartitionKeyed, RunKeyColumns):
    """A row of the table run_history: a succeeded run, written once in the sparse form of
    runs/history.py by the outcome statement (runs/execution/queries.py, COMPLETE) or, on
    Citus, by the executor's move after it (MOVE_SUCCEEDED), and only deleted, with its
    job or its day. Readers read it through JobRun, which gives the sparse columns back;
    this model counts and deletes, so it names the key alone."""

    class Meta:
        db_table = "run_history"

    def __str__(self) -> str:
        # A row is named by its run key, as the console and API name a run.
        return f"{self.job_id}/{self.scheduled_at.isoformat()}"


class JobRunRow(PartitionKeyed, RunColumns):
    """A row of the table job_runs: a run not succeeded (yet), for the services that lock
    and change one (cancel, replay). Readers take JobRun."""

    class Meta:
        db_table = "job_runs"
        constraints = [
            models.UniqueConstraint(
                fields=["partition_id", "job", "scheduled_at"], name="job_runs_job_scheduled_uniq"
            ),
        ]


class TargetHost(models.Model):
    """Circuit breaker and retry budget of one tenant's target host (runs/execution/breakers.py).

    Keyed by tenant too: one tenant's failures never hold back another's runs to the
    same host. No foreign key to tenants: rows are pruned once idle (breakers.prune_idle),
    and on Citus the table stays an ordinary coordinator table (a foreign key to the
    reference table `tenants` would make it a Citus local table)."""

    pk = models.CompositePrimaryKey("tenant_id", "host")
    tenant_id = models.BigIntegerField()
    host = models.CharField(max_length=300, help_text="scheme://host:port")
    state = models.CharField(max_length=10, default="closed")
    failures = models.IntegerField(default=0)
    failure_window_start = models.DateTimeField(null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    open_until = models.DateTimeField(null=True, blank=True)
    cooldown_seconds = models.FloatField(default=0)
    window_start = models.DateTimeField(null=True, blank=True)
    requests = models.IntegerField(default=0)
    retries = models.IntegerField(default=0)
    recovered_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "target_hosts"
        ordering = ["tenant_id", "host"]

    def __str__(self) -> str:
        return f"{self.host} of tenant {self.tenant_id} ({self.state})"


# --- runs admin area: the dead-letter queue as its own admin page --------------------------
class DeadRun(JobRun):
    """Proxy for the admin's dead-letter view (status='dead'); no table of its own."""

    class Meta:
        proxy = True
        verbose_name = "dead-letter run"
        verbose_name_plural = "dead-letter queue"


class ExecutorNode(models.Model):
    """Heartbeat row of a running executor (runs/execution/nodes.py writes it), shown on the dashboard.

    Its own table rather than a `kind` column on scheduler_nodes: the schedulers'
    rebalancing reads scheduler_nodes to split partitions, and an executor must never
    be counted in that split. Liveness is scheduler_project.liveness for both tables.
    """

    node_id = models.CharField(max_length=100, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    concurrency = models.IntegerField()
    in_flight = models.IntegerField(default=0, help_text="Runs claimed and not yet written back.")
    last_claim_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "executor_nodes"
        ordering = ["node_id"]

    def __str__(self) -> str:
        return self.node_id
