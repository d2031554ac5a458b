"""The job admin's own views: pause / resume / trigger from a job's page (a confirmation
that says what will happen, then the service) and the live schedule preview of the
change form."""

from __future__ import annotations

from collections.abc import Mapping

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from jobs import console, dst_form, services
from jobs.admin_base import actor_of
from jobs.describe import check_preview_schedule, preview
from jobs.field_rules import check_dst_policy
from jobs.job_admin_page import PREVIEW_COUNT
from jobs.models import Job
from jobs.validation import JobInvalid
from runs.keys import format_utc
from scheduler_project import db


class JobConsoleViews:
    """Mixed into JobAdmin: its extra URLs and their views."""

    def get_urls(self):
        extra = [
            path(
                "preview/",
                self.admin_site.admin_view(self.preview_view),
                name="jobs_job_preview",
            ),
            path(
                "<path:object_id>/operate/<str:operation>/",
                self.admin_site.admin_view(self.operate_view),
                name="jobs_job_operate",
            ),
        ]
        return extra + super().get_urls()

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """Pause / resume / trigger from the job page: GET says what will happen, POST does it."""
        if operation not in console.OPERATIONS:
            raise Http404(f"no operation {operation!r}")
        job = self.get_object(request, object_id)
        if job is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_change_permission(request, job):
            raise PermissionDenied
        change_url = reverse("admin:jobs_job_change", args=[job.pk])
        catch_up = request.POST.get("catch_up", request.GET.get("catch_up", "none"))
        if catch_up not in dict(console.CATCH_UP_CHOICES):
            choices = ", ".join(dict(console.CATCH_UP_CHOICES))
            return HttpResponseBadRequest(f"catch_up: must be one of {choices}")
        if request.method == "POST":
            message = self._operate(request, job=job, operation=operation, catch_up=catch_up)
            self.log_change(request, job, message)
            self.message_user(request, message, messages.SUCCESS)
            return HttpResponseRedirect(change_url)
        now = db.now()
        if operation == "resume":
            options = [
                (value, label, console.plan(job=job, operation="resume", catch_up=value, now=now))
                for value, label in console.CATCH_UP_CHOICES
            ]
        else:
            options = []
        context = {
            **self.admin_site.each_context(request),
            "title": f"{operation.capitalize()} {job.name}?",
            "opts": self.opts,
            "original": job,
            "job": job,
            "operation": operation,
            "plan": console.plan(job=job, operation=operation, catch_up=catch_up, now=now),
            "options": options,
            "catch_up": catch_up,
            "change_url": change_url,
        }
        return TemplateResponse(request, "admin/jobs/job/operate_confirm.html", context)

    def _operate(self, request: HttpRequest, *, job: Job, operation: str, catch_up: str) -> str:
        if operation == "pause":
            was = job.paused
            services.pause_job(job=job, actor=actor_of(request))
            return "The job was already paused." if was else "Paused: no slot fires until it is resumed."
        if operation == "resume":
            was = job.paused
            job = services.resume_job(job=job, catch_up=catch_up, actor=actor_of(request))
            if not was:
                return "The job was not paused."
            nxt = console.when(job.next_run_at, job, now=db.now())
            return f"Resumed (catch-up: {catch_up}); next run {nxt}."
        at = services.trigger_job(job=job, actor=actor_of(request))
        return f"Queued a manual run at {format_utc(at)}."

    def preview_view(self, request: HttpRequest) -> JsonResponse:
        """Fire times of the schedule being edited (the live preview on the change form)."""
        if not self.has_view_or_change_permission(request):
            return JsonResponse({"error": "forbidden"}, status=403)
        cron = request.GET.get("cron_expr", "").strip() or None
        interval_text = request.GET.get("interval_seconds", "").strip()
        interval = (
            (int(interval_text) if interval_text.isdigit() else interval_text) if interval_text else None
        )
        zone = request.GET.get("time_zone", "").strip() or "UTC"
        try:
            policy = _policy_param(request.GET)
            cron, interval = check_preview_schedule(
                cron=cron,
                interval_seconds=interval,
                timezone=zone,
                dst_policy=policy,
            )
        except JobInvalid as exc:
            # The page shows one line: the first problem found.
            return JsonResponse({"error": next(iter(exc.errors.values()))[0]}, status=400)
        except ValueError as exc:  # the DST menus' values
            return JsonResponse({"error": str(exc)}, status=400)
        now = timezone.now().replace(microsecond=0)  # whole seconds, as create_job anchors an interval
        return JsonResponse(
            preview(
                cron=cron,
                timezone=zone,
                interval_seconds=interval,
                after=now,
                count=PREVIEW_COUNT,
                dst_policy=policy,
            )
        )


def _policy_param(params: Mapping[str, str]) -> dict:
    """The DST menus as chosen (jobs/dst_form.py: `dst_policy_repeated`,
    `dst_policy_missing`; unset = Debian cron's rule)."""
    value = {key: params.get(f"dst_policy_{key}", "").strip() for key in dst_form.KEYS}
    try:
        return check_dst_policy({key: v for key, v in value.items() if v})
    except ValueError as exc:
        raise ValueError("dst_policy: " + " ".join(map(str, exc.args))) from None
