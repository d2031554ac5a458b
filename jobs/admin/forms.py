"""Admin form for jobs: the same service rules as the API (jobs/rules/edits.py), field by field."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.conf import settings

from jobs.admin.dst_form import DstPolicyMenusField
from jobs.models import Job, TriggerType
from jobs.rules import edits, nesting
from jobs.rules.job import SCHEDULE_KEY, TRIGGER_FIELDS, TRIGGER_KIND_FIELDS, JobInvalid
from runs.target_secrets import redact_target
from scheduler_project import db

# Grouped as the admin's fieldsets show them (jobs/admin/__init__.py), so each list is written once.
SCHEDULE_FORM_FIELDS = (
    "trigger_kind",
    "cron_expr",
    "time_zone",
    "dst_policy",
    "interval_seconds",
    "run_at",
    "start_at",
    "end_at",
    "jitter_seconds",
)
POLICY_FORM_FIELDS = (
    "misfire_policy",
    "max_catch_up",
    "starting_deadline_seconds",
    "overlap_policy",
    "max_attempts",
    "retry_backoff_seconds",
    "retry_backoff_cap_seconds",
    "lease_seconds",
    "alert_after_failures",
)
FORM_FIELDS = ("tenant", "name", "paused", "priority", *SCHEDULE_FORM_FIELDS, "target", *POLICY_FORM_FIELDS)
# Fields jobs.rules.job judges; the rest (tenant, paused, the trigger kind) need only the
# form's own checks.
VALIDATED_FIELDS = tuple(f for f in FORM_FIELDS if f not in ("tenant", "paused", "trigger_kind"))
# Fields of some trigger kind: the form reads only the chosen kind's.
_KIND_FIELDS = {f for fields in TRIGGER_KIND_FIELDS.values() for f in fields}

# `target.kwargs.<name>...: message` (runs.task_schema.errors): the kwarg a problem is about.
_KWARG_PROBLEM = re.compile(r"^target\.kwargs\.([^.\[:\s]+)")

_TARGET_EXAMPLE = json.dumps({"type": "http", "url": "https://example.com/hook", "method": "POST"})


class TargetJSONField(forms.JSONField):
    """The target's JSON text, decoded within the bound of an API body (jobs.rules.nesting)."""

    def to_python(self, value):
        try:
            with nesting.decoding():
                value = super().to_python(value)
            nesting.check_document(value)
        except nesting.TooDeep as exc:
            raise forms.ValidationError(str(exc), code="too_deep") from None
        return value

    def bound_data(self, data, initial):
        # The form shown again with its errors: text too deep to decode is shown as typed.
        try:
            with nesting.decoding():
                return super().bound_data(data, initial)
        except nesting.TooDeep:
            return forms.fields.InvalidJSONInput(data)


class JobAdminForm(forms.ModelForm):
    # Which trigger the job has; the page shows only that kind's fields (jobs/static/jobs/
    # trigger_kind.js), and the form reads only them: the others are cleared (triggers) or
    # left as stored (zone, DST), as a PATCH naming one trigger does. Not posted (an older
    # page): every trigger field is read, as before.
    trigger_kind = forms.ChoiceField(
        label="trigger",
        choices=TriggerType.choices,
        required=False,
        widget=forms.RadioSelect(attrs={"data-kind-fields": json.dumps(TRIGGER_KIND_FIELDS)}),
    )

    class Media:
        js = ("jobs/trigger_kind.js",)

    # Two menus, not the model's JSON textarea (jobs/admin/dst_form.py).
    dst_policy = DstPolicyMenusField(
        label="DST",
        help_text="Cron's rule (Debian's): a fixed time such as 30 1 * * * runs once, the first "
        "time, and just after a gap; a schedule whose minute or hour is * runs at every real "
        "instant that matches (both times, none in a gap). Interval and one-time jobs ignore DST.",
    )

    class Meta:
        model = Job
        fields = FORM_FIELDS
        # The API's names (`cron`, `timezone`) as labels; the columns keep their names.
        labels = {"cron_expr": "cron", "time_zone": "timezone", "interval_seconds": "interval (seconds)"}
        field_classes = {"target": TargetJSONField}
        help_texts = {
            "cron_expr": "5 fields, names (MON, JAN), @daily-style aliases, H hashed per job. "
            "Set exactly one of cron, interval and run at.",
            "time_zone": "IANA zone the cron expression is evaluated in, e.g. Europe/Berlin.",
            "interval_seconds": "Elapsed seconds between runs (DST-free).",
            "run_at": "One-time run (UTC).",
            "jitter_seconds": "Runs start up to this many seconds after their slot (a stable offset per "
            "slot); at most the schedule's shortest gap.",
            "starting_deadline_seconds": "A slot found later than this many seconds is a misfire (the "
            "misfire policy decides); Kubernetes' startingDeadlineSeconds. Empty: the global "
            f"SCHEDULER_MISFIRE_THRESHOLD_SECONDS ({settings.SCHEDULER_MISFIRE_THRESHOLD_SECONDS} s).",
            "target": "Fill in the fields (a task gets one input per kwarg); they write the JSON "
            "below it (the stored value), "
            f"e.g. {_TARGET_EXAMPLE} or "
            '{"type": "task", "name": "noop", "kwargs": {}}',
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance._state.adding and "target" in self.fields:
            # Django renders an empty JSONField as `null`; an empty object reads as "fill me in".
            self.fields["target"].initial = {}
        elif "target" in self.fields:
            # Secrets are write-only: the page shows "***", and an untouched "***" keeps
            # the stored value (clean() puts it back); typing a new value replaces it.
            self.initial["target"] = redact_target(self.instance.target)
        if "jitter_seconds" in self.fields:
            # Optional like in the API: a form posted without it (an older page) means 0.
            self.fields["jitter_seconds"].required = False
        if "trigger_kind" in self.fields:
            self.fields["trigger_kind"].initial = (
                TriggerType.CRON if self.instance._state.adding else self.instance.trigger_type
            )

    def _kind(self) -> str | None:
        """The trigger kind chosen on the page, or None when the page did not say."""
        return (getattr(self, "cleaned_data", None) or {}).get("trigger_kind") or None

    def _ignored(self) -> set[str]:
        """Fields of the kinds not chosen: their (hidden) inputs are not read."""
        kind = self._kind()
        return _KIND_FIELDS - set(TRIGGER_KIND_FIELDS[kind]) if kind else set()

    def clean_jitter_seconds(self):
        value = self.cleaned_data.get("jitter_seconds")
        return 0 if value is None else value

    def new_job_fields(self) -> dict[str, Any]:
        """The fields of a new job (jobs.services.create_job adds the defaults)."""
        ignored = self._ignored()
        fields = {
            f: self.cleaned_data[f] for f in VALIDATED_FIELDS if f in self.cleaned_data and f not in ignored
        }
        fields["paused"] = self.cleaned_data.get("paused", False)
        return fields

    def job_changes(self) -> dict[str, Any]:
        """The edit this form makes, for jobs.services.update_job.

        With a trigger kind chosen, only its trigger field is sent when it or the kind
        changed, and jobs.rules.edits clears the other two (the PATCH rule); the other
        kinds' fields are not read. Without one (an older page), when any trigger field
        changed all three are sent as shown.
        """
        cleaned, kind, ignored = self.cleaned_data, self._kind(), self._ignored()
        names = [f for f in self.changed_data if f in VALIDATED_FIELDS and f not in ignored]
        if kind is not None:
            own = [f for f in TRIGGER_KIND_FIELDS[kind] if f in TRIGGER_FIELDS]
            if kind != self.instance.trigger_type or any(f in names for f in own):
                names += [f for f in own if f not in names]
        elif any(f in TRIGGER_FIELDS for f in names):
            names += [f for f in TRIGGER_FIELDS if f not in names]
        return {f: cleaned[f] for f in names if f in cleaned}

    def clean(self):
        cleaned = super().clean()
        for name in self._ignored():
            # A hidden input of another kind is not read, even one that does not parse:
            # another kind's trigger is cleared, the zone and DST stay as stored.
            self.errors.pop(name, None)
            if name in TRIGGER_FIELDS:
                cleaned[name] = None
            else:
                cleaned.pop(name, None)
        # A trigger field that did not even parse: do not also claim "none is set".
        trigger_unparsed = any(f in self.errors for f in TRIGGER_FIELDS)
        try:
            if self.instance._state.adding:
                # A new instance already has its id (uuid4 default) and save_model creates
                # the job with it: H is validated with the seed it will be scheduled with.
                clean = edits.new_job_values(self.new_job_fields(), job_id=self.instance.pk, now=db.now())
            else:
                clean = edits.job_changes(self.instance, self.job_changes(), now=db.now())
        except JobInvalid as exc:
            for field, messages in exc.errors.items():
                if field == SCHEDULE_KEY and trigger_unparsed:
                    continue
                # The "exactly one trigger" problem sits on the cron field: an error there
                # also keeps the model's check constraint from repeating it.
                target = "cron_expr" if field == SCHEDULE_KEY else field
                for message in messages:
                    self.add_error(target if target in self.fields else None, message)
            return cleaned
        cleaned.update({k: v for k, v in clean.items() if k in cleaned or k == "cron_expr"})
        return cleaned

    def kwargs_errors(self) -> dict[str, list[str]]:
        """The target's problems about one task kwarg, by kwarg name: the change form shows
        each beside that kwarg's input (they also stay in the target's error list)."""
        by_kwarg: dict[str, list[str]] = {}
        for message in self.errors.get("target", []):
            match = _KWARG_PROBLEM.match(message)
            if match:
                by_kwarg.setdefault(match.group(1), []).append(message)
        return by_kwarg
