"""Job API shapes. Serializers parse types; what a create or a PATCH means (defaults,
the trigger rule, the merge, jobs.rules.job) is jobs.services' (jobs/rules/edits.py), whose
JobInvalid the error handler turns into field-level 400s with the API's names."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs import health, schedule
from jobs.describe import describe_job
from jobs.health import overdue_seconds
from jobs.models import API_FIELD_NAMES, Job, Misfire, MisfirePolicy, OverlapPolicy, TriggerType
from jobs.schedule.jitter import JITTER_MAX_SECONDS
from runs.api.fields import RejectUnknownMixin
from runs.target_secrets import redact_target

from .fields import (
    BoundedJSONField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    UtcDateTimeField,
)


def api_errors(errors: dict[str, list[str]]) -> dict[str, list[str]]:
    return {API_FIELD_NAMES.get(key, key): messages for key, messages in errors.items()}


class TargetField(BoundedJSONField):
    """`{"type": "http", "url", "method", "headers", "body", "timeout_seconds", "secret_headers"}` or
    `{"type": "task", "name", "kwargs", "timeout_seconds"}`; validated in jobs.rules.target.check_target.

    Secret header values (Authorization, Cookie, names containing token/secret/key/
    password, and those listed in `secret_headers`) are write-only: they read back as
    "***", and sending "***" back keeps the stored value."""

    def to_representation(self, value):
        return redact_target(value)


_DST_POLICY_SCHEMA = {
    "type": "object",
    "properties": {
        "repeated": {
            "type": "string",
            "enum": list(schedule.DST_REPEATED),
            "nullable": True,
            "description": "A wall time that happens twice (fall back): fire at the first, the last, "
            "or both. null: Debian cron's rule (fixed-time jobs first, elapsed-time jobs both).",
        },
        "missing": {
            "type": "string",
            "enum": list(schedule.DST_MISSING),
            "nullable": True,
            "description": "A wall time that does not exist (spring forward): shift to the first instant "
            "after the gap, or skip it. null: Debian cron's rule (fixed-time shift, elapsed-time skip).",
        },
    },
    "additionalProperties": False,
}


@extend_schema_field(_DST_POLICY_SCHEMA)
class DstPolicyField(BoundedJSONField):
    """Validated in jobs.rules.fields.check_dst_policy; shown with both keys (null = not chosen)."""

    def to_representation(self, value):
        value = value or {}
        return {"repeated": value.get("repeated"), "missing": value.get("missing")}


class JobSerializer(RejectUnknownMixin, serializers.Serializer):
    id = serializers.UUIDField(read_only=True)
    name = StrictCharField(max_length=None, allow_blank=True, trim_whitespace=False)
    cron = StrictCharField(source="cron_expr", required=False, allow_null=True, allow_blank=True)
    interval_seconds = StrictIntegerField(required=False, allow_null=True)
    run_at = UtcDateTimeField(required=False, allow_null=True)
    timezone = StrictCharField(source="time_zone", required=False)
    dst_policy = DstPolicyField(
        required=False,
        allow_null=True,
        help_text="Per-job DST rule for cron schedules (README, DST); omitted keys keep Debian cron's rule.",
    )
    target = TargetField()
    misfire_policy = serializers.ChoiceField(choices=MisfirePolicy.choices, required=False)
    max_catch_up = StrictIntegerField(required=False)
    overlap_policy = serializers.ChoiceField(choices=OverlapPolicy.choices, required=False)
    max_attempts = StrictIntegerField(required=False)
    retry_backoff_seconds = StrictIntegerField(required=False)
    retry_backoff_cap_seconds = StrictIntegerField(required=False)
    lease_seconds = StrictIntegerField(required=False)
    priority = StrictIntegerField(required=False)
    alert_after_failures = StrictIntegerField(required=False)
    jitter_seconds = StrictIntegerField(
        required=False,
        help_text="Each run starts up to this many seconds after its slot, at a stable offset derived from "
        "(job id, slot); the slot and run key do not move. 0..the schedule's shortest gap (interval, or the "
        "smallest distance among the next 50 cron fire times), at most 86400.",
    )
    starting_deadline_seconds = StrictIntegerField(
        required=False,
        allow_null=True,
        help_text="Kubernetes' startingDeadlineSeconds: a slot the scheduler finds later than this is a "
        "misfire (misfire_policy decides what runs). 1..604800 (7 days); null (the default) means "
        "SCHEDULER_MISFIRE_THRESHOLD_SECONDS. health.on_time_threshold_seconds shows the value in effect.",
    )
    paused = StrictBooleanField(required=False)
    start_at = UtcDateTimeField(required=False, allow_null=True)
    end_at = UtcDateTimeField(required=False, allow_null=True)

    trigger_type = serializers.ChoiceField(
        choices=TriggerType.choices,
        read_only=True,
        help_text="Which trigger field is set: "
        + "; ".join(f"`{t.value}` (shown in the console as {t.label!r})" for t in TriggerType)
        + ".",
    )
    schedule_description = serializers.SerializerMethodField()
    dst_policy_effective = serializers.SerializerMethodField()
    next_run_at = UtcDateTimeField(read_only=True)
    partition_id = serializers.IntegerField(read_only=True)
    target_version = serializers.IntegerField(
        read_only=True,
        help_text="Version of `target`: each change of the target makes the next one, and a run "
        "calls the version it was created with (its `target_version`).",
    )
    created_at = UtcDateTimeField(read_only=True)
    updated_at = UtcDateTimeField(read_only=True)
    misfires = serializers.SerializerMethodField()
    last_outcome = serializers.CharField(
        read_only=True, help_text="succeeded, failed, dead, or empty before any"
    )
    # Annotated by the views (jobs.health.last_success_at): the row alone can be stale.
    last_success_at = UtcDateTimeField(source="last_success", read_only=True)
    last_failure_at = UtcDateTimeField(read_only=True)
    consecutive_failures = serializers.IntegerField(read_only=True)
    overdue_seconds = serializers.SerializerMethodField(
        help_text="Null unless the next slot is late by more than SCHEDULER_OVERDUE_ALERT_SECONDS."
    )

    def get_overdue_seconds(self, job: Job) -> float | None:
        return overdue_seconds(job, now=self.context.get("now") or timezone.now())

    def get_schedule_description(self, job: Job) -> str:
        return describe_job(job)

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "properties": {
                "repeated": {"type": "string", "enum": list(schedule.DST_REPEATED)},
                "missing": {"type": "string", "enum": list(schedule.DST_MISSING)},
            },
            "description": "The DST rule the scheduler applies (dst_policy with defaults filled in); "
            "null for interval and one-time jobs, which are DST-free.",
        }
    )
    def get_dst_policy_effective(self, job: Job) -> dict | None:
        if not job.cron_expr:
            return None
        try:
            policy = schedule.dst_policy_for(job.cron_expr, job.dst_policy)
        except schedule.ScheduleError:
            return None
        return {"repeated": policy.repeated, "missing": policy.missing}

    @extend_schema_field(
        {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "url": {"type": "string"}},
        }
    )
    def get_misfires(self, job: Job) -> dict:
        return {"count": health.misfire_count(job), "url": f"/api/v1/jobs/{job.id}/misfires/"}

    def to_representation(self, job: Job) -> dict:
        data = super().to_representation(job)
        data["cron"] = job.cron_expr or None
        return data


class SlotWindowSerializer(serializers.Serializer):
    """A window of jobs.health.job_health (a shape)."""

    seconds = serializers.IntegerField(
        help_text="The window's length: slots scheduled in the last this many s."
    )
    slots = serializers.IntegerField(
        help_text="Slots of the schedule in the window whose run started, or whose on-time threshold "
        "passed without a start (manual, backfill and replayed runs, overlap-skipped runs and runs "
        "cancelled before starting are not counted)."
    )
    on_time = serializers.IntegerField(
        help_text="Of those, runs that started within the threshold of their slot."
    )
    on_time_rate = serializers.FloatField(allow_null=True, help_text="on_time / slots; null without a slot.")
    lateness_p50_seconds = serializers.FloatField(
        allow_null=True,
        help_text="Median of started_at - scheduled_at over the window's started runs (a retried run's "
        "latest start; percentile_cont, linear between ranks); null without one.",
    )
    lateness_p99_seconds = serializers.FloatField(allow_null=True, help_text="Its 99th percentile.")


class JobHealthSerializer(serializers.Serializer):
    """jobs.health.job_health (a shape)."""

    consecutive_failures = serializers.IntegerField()
    alert_after_failures = serializers.IntegerField()
    failing = serializers.BooleanField(help_text="consecutive_failures >= alert_after_failures.")
    last_success_at = UtcDateTimeField(allow_null=True)
    last_failure_at = UtcDateTimeField(allow_null=True)
    overdue_seconds = serializers.FloatField(
        allow_null=True,
        help_text="Null unless the next slot is late by more than SCHEDULER_OVERDUE_ALERT_SECONDS.",
    )
    misfire_count = serializers.IntegerField()
    on_time_threshold_seconds = serializers.IntegerField(
        help_text="The job's starting deadline in effect: starting_deadline_seconds, or when null "
        "SCHEDULER_MISFIRE_THRESHOLD_SECONDS."
    )
    last_24h = SlotWindowSerializer()
    last_7d = SlotWindowSerializer()


class JobDetailSerializer(JobSerializer):
    """A job as GET /jobs/{id}/ gives it: the job and its `health`."""

    health = serializers.SerializerMethodField()

    @extend_schema_field(JobHealthSerializer)
    def get_health(self, job: Job) -> dict:
        figures = health.job_health(job, now=self.context.get("now") or timezone.now())
        return JobHealthSerializer(figures).data


class ResumeSerializer(RejectUnknownMixin, serializers.Serializer):
    catch_up = serializers.ChoiceField(choices=["none", "latest", "all"], required=False, default="none")


class BackfillSerializer(RejectUnknownMixin, serializers.Serializer):
    start = UtcDateTimeField()
    end = UtcDateTimeField()
    # The window's rules (end after start, past only, retention, size) are the service's:
    # jobs.services.plan_backfill, which the console's backfill form calls too.
    dry_run = StrictBooleanField(required=False, default=False)


class BackfillResultSerializer(serializers.Serializer):
    job_id = serializers.UUIDField()
    dry_run = serializers.BooleanField()
    created = serializers.IntegerField(
        help_text="Runs inserted (0 on a dry run); slots that already had a run are left alone."
    )
    scheduled_at = serializers.ListField(
        child=serializers.CharField(), help_text="Slots created, or on a dry run the slots that would be."
    )
    already_present = serializers.IntegerField(help_text="Slots in the range that already have a run.")
    capped = serializers.BooleanField(
        help_text="More slots are missing than one request may create (a dry run lists the first ones)."
    )


class TriggerResultSerializer(serializers.Serializer):
    job_id = serializers.UUIDField()
    scheduled_at = serializers.CharField()
    run = serializers.CharField(help_text="URL of the created run.")


class MisfireSerializer(serializers.ModelSerializer):
    detected_at = UtcDateTimeField()
    first_missed_at = UtcDateTimeField()
    last_missed_at = UtcDateTimeField()
    # A plain string: an enum here would be a second name for MisfirePolicy in the schema.
    policy = serializers.CharField(help_text="misfire_policy of the job when the misfire was handled")

    class Meta:
        model = Misfire
        fields = [
            "id",
            "detected_at",
            "policy",
            "missed_count",
            "count_is_lower_bound",
            "first_missed_at",
            "last_missed_at",
            "runs_created",
        ]


class OccurrenceQuerySerializer(serializers.Serializer):
    """Query string of /jobs/{id}/occurrences: [from, to), a cursor and a page size."""

    # `from` is a Python keyword: the field is declared under another name below.
    to = UtcDateTimeField(required=False, help_text="Exclusive; default now.")
    cursor = serializers.CharField(required=False)
    page_size = serializers.IntegerField(required=False, default=100, min_value=1, max_value=1000)

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = UtcDateTimeField(
            required=False, help_text="Inclusive; default 24 hours before `to`."
        )
        return fields

    def validate(self, attrs: dict) -> dict:
        if attrs.get("from") and attrs.get("to") and attrs["to"] <= attrs["from"]:
            raise serializers.ValidationError({"to": ["to must be later than from."]})
        return attrs


class OccurrenceRunSerializer(serializers.Serializer):
    status = serializers.CharField()
    attempt = serializers.IntegerField()
    trigger = serializers.CharField()
    url = serializers.CharField()
    dispatch_note = serializers.CharField(
        allow_null=True, help_text="e.g. 'deferred by tenant rate limit to 2026-12-03T09:04:00Z'."
    )


class OccurrenceSerializer(serializers.Serializer):
    scheduled_at = serializers.CharField()
    outcome = serializers.ChoiceField(choices=["fired", "skipped", "missed", "pending"])
    reason = serializers.CharField(
        allow_null=True,
        help_text="paused, overlap_skip, buffer_full, misfire_skip, misfire_coalesced, catch_up_limit, "
        "schedule_changed or overdue; for a fired slot null, or rate_limited when the tenant's "
        "max_runs_per_minute deferred its start (run.dispatch_note says to when).",
    )
    run = OccurrenceRunSerializer(allow_null=True)


class FireTimeSerializer(serializers.Serializer):
    utc = serializers.CharField()
    local = serializers.CharField()
    note = serializers.CharField(allow_null=True)


class PreviewSerializer(serializers.Serializer):
    fire_times = FireTimeSerializer(many=True)
    description = serializers.CharField()
    timezone = serializers.CharField()


class PreviewQuerySerializer(serializers.Serializer):
    """Query string of /schedules/preview: strings, so the standard (coercing) fields."""

    cron = serializers.CharField(required=False, allow_blank=True)
    interval_seconds = serializers.IntegerField(required=False)
    timezone = serializers.CharField(required=False, default="UTC")
    after = UtcDateTimeField(required=False)
    count = serializers.IntegerField(required=False, default=10, min_value=1, max_value=100)
    jitter_seconds = serializers.IntegerField(
        required=False,
        default=0,
        min_value=0,
        max_value=JITTER_MAX_SECONDS,
        help_text="Show each fire time's start window (at most the schedule's shortest gap).",
    )
    dst_repeated = serializers.ChoiceField(
        choices=schedule.DST_REPEATED,
        required=False,
        help_text="dst_policy.repeated of the job being previewed (default: Debian cron's rule).",
    )
    dst_missing = serializers.ChoiceField(
        choices=schedule.DST_MISSING,
        required=False,
        help_text="dst_policy.missing of the job being previewed (default: Debian cron's rule).",
    )


class PreviewCountSerializer(serializers.Serializer):
    count = serializers.IntegerField(required=False, default=10, min_value=1, max_value=100)


class HealthSerializer(serializers.Serializer):
    status = serializers.CharField(help_text='"ok", or "degraded" when the database is unreachable')
    database = serializers.CharField()
    time = serializers.CharField()


class ForecastQuerySerializer(serializers.Serializer):
    """Query string of /forecast: [from, to) and seconds per step (bounds: jobs.forecast.window)."""

    # `from` is a Python keyword: the field is declared under another name below.
    to = UtcDateTimeField(required=False, help_text="Exclusive; default 24 h after `from`.")
    step = serializers.IntegerField(
        required=False, help_text="Seconds per step, default 60; at most 10,080 steps in the window."
    )

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = UtcDateTimeField(
            required=False,
            help_text="Inclusive; default the start of the current step (the next 24 h from now). "
            "The window spans at most 7 days.",
        )
        return fields


class SpreadSerializer(serializers.Serializer):
    suggestion = serializers.CharField(help_text='The expression to use instead, e.g. "H * * * *".')
    why = serializers.CharField()


class CauseSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["cron", "interval", "one_time"])
    cron = serializers.CharField(allow_null=True, help_text="As written (H and aliases unexpanded).")
    interval_seconds = serializers.IntegerField(allow_null=True)
    jobs = serializers.IntegerField(help_text="Jobs on it due in the step, in every zone.")
    runs = serializers.IntegerField(
        help_text="Their runs due in the step (an interval shorter than it: several)."
    )
    timezones = serializers.DictField(
        child=serializers.IntegerField(), help_text="A cron expression's jobs per zone, the 5 largest."
    )
    spread = SpreadSerializer(
        allow_null=True,
        help_text="How these jobs could stop firing together: a fixed minute that H would spread, or a "
        "shared */N phase that H/N would; null when there is nothing to spread.",
    )


class SpikeSerializer(serializers.Serializer):
    at = serializers.CharField(help_text="Start of the step.")
    index = serializers.IntegerField(help_text="Its position in `counts`.")
    count = serializers.IntegerField()
    times_mean = serializers.FloatField(help_text="count / the window's mean per step.")
    causes = CauseSerializer(many=True, help_text="Largest first, at most 10.")
    other_runs = serializers.IntegerField(help_text="Runs of the step from schedules beyond the listed ones.")
    repeats = serializers.IntegerField(
        help_text="Steps of the window holding this count, this one included (24: every top of the hour)."
    )


class ForecastSerializer(serializers.Serializer):
    # `from` is a Python keyword: declared under another name below.
    to = serializers.CharField()
    step = serializers.IntegerField(help_text="Seconds per step.")
    total = serializers.IntegerField(help_text="Runs due in the window.")
    counts = serializers.ListField(child=serializers.IntegerField(), help_text="Runs due per step, in order.")
    spikes = SpikeSerializer(
        many=True,
        help_text="The largest counts (at most 5) above twice the mean per step and at least half the "
        "busiest step's, largest first, each at its first step with how many steps hold it.",
    )

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.CharField()
        return fields


class EditSlotListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    times = serializers.ListField(child=serializers.CharField(), help_text="The first 100, oldest first.")


class EditFireTimesSerializer(serializers.Serializer):
    # `from` is a Python keyword: declared under another name below.
    to = serializers.CharField(help_text="End of the compared window (a week from now unless truncated).")
    truncated = serializers.BooleanField(
        help_text="A side had more than 20,000 slots in the week: compared up to `to` only."
    )
    before = EditSlotListSerializer()
    after = EditSlotListSerializer()
    added = EditSlotListSerializer()
    removed = EditSlotListSerializer()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.CharField(help_text="Now.")
        return fields


class EditNextRunSerializer(serializers.Serializer):
    before = serializers.CharField(allow_null=True)
    after = serializers.CharField(allow_null=True)


class EditDueNowSerializer(serializers.Serializer):
    due = serializers.BooleanField(help_text="After the change a slot is due and is dispatched at once.")
    because_of_edit = serializers.BooleanField()
    note = serializers.CharField()


class EditPastSlotsSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Slots already due and never dispatched.")
    count_is_lower_bound = serializers.BooleanField()
    first = serializers.CharField(allow_null=True)
    last = serializers.CharField(allow_null=True)
    will_run = serializers.IntegerField(help_text="How many of them will get a run.")
    rule = serializers.ChoiceField(
        choices=["none", "schedule_changed", "paused", "on_time", "misfire_policy"]
    )
    note = serializers.CharField()


class EditLedgerRangeSerializer(serializers.Serializer):
    first_at = serializers.CharField()
    last_at = serializers.CharField()
    outcome = serializers.CharField()
    reason = serializers.CharField()


class EditPreviewSerializer(serializers.Serializer):
    """The answer of PATCH /jobs/{id}/?dry_run=true (jobs/edit_preview.py)."""

    dry_run = serializers.BooleanField()
    job = JobSerializer(help_text="The job as the change would leave it.")
    changes = serializers.DictField(help_text="The audit entry's {field: [old, new]} (model field names).")
    schedule_changed = serializers.BooleanField()
    next_run_at = EditNextRunSerializer()
    fire_times = EditFireTimesSerializer()
    due_now = EditDueNowSerializer()
    past_slots = EditPastSlotsSerializer()
    ledger_ranges = EditLedgerRangeSerializer(many=True, help_text="The ranges the change would record.")
