"""Backfill from the job page: a window typed in the job's zone or in UTC, the dry run's
list of slots (those that would get a run, and those that already have one), then the
backfill itself. The window's rules and limits are jobs.services.plan_backfill's, the
same the API's `POST /api/v1/jobs/{id}/backfill` answers by; this form only reads the
two times and the zone they are written in."""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, strip_tags
from django.utils.safestring import SafeString

from jobs import schedule, services
from jobs.admin.base import actor_of
from jobs.admin.display import in_zone, relative
from jobs.models import Job
from runs.keys import format_utc

WALL_FORMAT = "%Y-%m-%dT%H:%M:%S"


class WallTimeField(forms.DateTimeField):
    """A date and time as typed, without a zone: the form's `zone` says how to read it.
    A value written with an offset (`...Z`, `+02:00`) is that instant whatever the zone."""

    # Text, not the browser's localized date picker: the same ISO form every console page
    # shows, and an instant with its offset can be pasted as is.
    widget = forms.DateTimeInput(
        attrs={"placeholder": "2026-01-31T09:00:00", "size": 22, "class": "vTextField"}, format=WALL_FORMAT
    )

    def to_python(self, value):
        if value in self.empty_values:
            return None
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        try:
            parsed = parse_datetime(text)
        except ValueError:
            parsed = None
        if parsed is None:
            raise forms.ValidationError(
                "Enter a date and time such as 2026-01-31T09:00 (or an ISO instant ending in Z).",
                code="invalid",
            )
        # The calendar's ends overflow when moved between zones; no run lives there anyway.
        if not 1 < parsed.year < 9999:
            raise forms.ValidationError("Enter a date between the years 2 and 9998.", code="invalid")
        return parsed


class BackfillForm(forms.Form):
    start = WallTimeField(label="From", help_text="The first slot considered (inclusive).")
    end = WallTimeField(label="To", help_text="The last slot considered (inclusive); not in the future.")
    zone = forms.ChoiceField(label="Times are in")

    def __init__(self, *args, job: Job, **kwargs):
        super().__init__(*args, **kwargs)
        self.job = job
        choices = [(job.time_zone, f"{job.time_zone} (the job's zone)")]
        if job.time_zone != "UTC":
            choices.append(("UTC", "UTC"))
        self.fields["zone"].choices = choices
        self.fields["zone"].initial = job.time_zone

    def clean(self):
        cleaned = super().clean()
        zone = cleaned.get("zone")
        if zone is None:
            return cleaned
        for name in ("start", "end"):
            wall = cleaned.get(name)
            if wall is not None and wall.tzinfo is None:
                instant = self._instant(name, wall, zone)
                if instant is not None:
                    cleaned[name] = instant
        return cleaned

    def _instant(self, name: str, wall: datetime, zone: str) -> datetime | None:
        try:
            found = schedule.wall_instants(wall, zone)
        except OverflowError:
            self.add_error(name, "This date is out of range.")
            return None
        if not found:
            self.add_error(name, f"{wall:%Y-%m-%d %H:%M:%S} does not exist in {zone} (the clocks skip it).")
            return None
        # A wall time shown twice (the hour repeated when clocks go back): the window is
        # read as wide as it can be, from the first reading to the last.
        return found[0] if name == "start" else found[-1]

    def window(self) -> dict[str, datetime]:
        return {"start": self.cleaned_data["start"], "end": self.cleaned_data["end"]}

    def as_query(self) -> dict[str, str]:
        """The window as typed, for the confirmation's hidden fields."""
        return {name: self.data.get(name, "") for name in ("start", "end", "zone")}


def initial(job: Job, *, now: datetime) -> dict[str, str]:
    """A window to start from: the last 24 hours, in the job's zone, to the minute."""
    zone = schedule.load_zone(job.time_zone)
    end = now.astimezone(zone).replace(second=0, microsecond=0)
    start = (now - timedelta(days=1)).astimezone(zone).replace(second=0, microsecond=0)
    return {"start": start.strftime(WALL_FORMAT), "end": end.strftime(WALL_FORMAT), "zone": job.time_zone}


def backfill_view(model_admin, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET: the form, and with `preview` the dry run's list (nothing written). POST: the
    backfill through jobs.services.backfill_job, audited under the operator."""
    job = model_admin.get_object(request, unquote(object_id))
    if job is None:
        return model_admin._get_obj_does_not_exist_redirect(request, model_admin.opts, object_id)
    if not model_admin.has_change_permission(request, job):
        raise PermissionDenied
    job_url = reverse("admin:jobs_job_change", args=[job.pk])
    if request.method == "POST":
        form = BackfillForm(request.POST, job=job)
        if form.is_valid():
            try:
                plan, created = services.backfill_job(job=job, actor=actor_of(request), **form.window())
            except services.ServiceError as exc:
                form.add_error(exc.field, exc.message)
            else:
                message = _done(job, plan, created)
                model_admin.log_change(request, job, strip_tags(message))
                model_admin.message_user(request, message, messages.SUCCESS if created else messages.WARNING)
                return HttpResponseRedirect(job_url)
        return _page(model_admin, request, job, form, status=400)
    if "preview" not in request.GET:
        form = BackfillForm(initial=initial(job, now=timezone.now()), job=job)
        return _page(model_admin, request, job, form)
    form = BackfillForm(request.GET, job=job)
    plan = window = None
    if form.is_valid():
        window = form.window()
        try:
            plan = services.plan_backfill(job=job, **window)
        except services.ServiceError as exc:
            form.add_error(exc.field, exc.message)
        else:
            if plan.capped:
                # Listed as the API's dry run lists it, but not offered: the backfill refuses it.
                form.add_error("end", services.BACKFILL_CAPPED)
    status = 200 if form.is_valid() else 400
    return _page(model_admin, request, job, form, plan=plan, window=window, status=status)


def _done(job: Job, plan: services.BackfillPlan, created: list[datetime]) -> SafeString | str:
    if not created:
        return "Nothing backfilled: every slot of the window already has a run."
    query = urlencode({"job": job.pk, "trigger__exact": "backfill"})
    skipped = plan.already_present + len(plan.missing) - len(created)
    return format_html(
        "Backfilled {} run{} ({} to {}), queued now; {} slot{} already had a run. "
        '<a href="{}?{}">See the job&rsquo;s backfill runs</a>.',
        len(created),
        "" if len(created) == 1 else "s",
        in_zone(created[0], job.time_zone),
        in_zone(created[-1], job.time_zone),
        skipped,
        "" if skipped == 1 else "s",
        reverse("admin:runs_jobrun_changelist"),
        query,
    )


def _page(
    model_admin, request, job: Job, form: BackfillForm, *, plan=None, window=None, status: int = 200
) -> TemplateResponse:
    now = timezone.now()
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Backfill {job.name}",
        "opts": model_admin.opts,
        "original": job,
        "job": job,
        "form": form,
        "plan": plan,
        "job_url": reverse("admin:jobs_job_change", args=[job.pk]),
        "max_runs": services.MAX_BACKFILL_RUNS,
        "retention_days": settings.RUN_RETENTION_DAYS,
    }
    if plan is not None:
        context.update(
            missing=[(in_zone(t, job.time_zone), format_utc(t), relative(t, now=now)) for t in plan.missing],
            present=[
                (
                    in_zone(p.scheduled_at, job.time_zone),
                    format_utc(p.scheduled_at),
                    p.status,
                    reverse("admin:runs_jobrun_change", args=[p.run_id]),
                )
                for p in plan.present
            ],
            confirm=form.as_query() if form.is_valid() and plan.missing else None,
            window=(format_utc(window["start"]), format_utc(window["end"])),
        )
    return TemplateResponse(request, "admin/jobs/job/backfill.html", context, status=status)
