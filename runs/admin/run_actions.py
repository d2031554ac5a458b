"""What an operator may do to runs from the admin: replay and cancel, in bulk from a list
(the runs list, the dead-letter queue) or one run from its page or its row.

Every one asks first: a GET (or a bulk action without `confirmed=yes`) shows what will
happen to which runs, and only the confirmation's POST changes anything. Each goes
through runs.services (the same conditional UPDATEs as the API), is recorded as an admin
LogEntry against JobRun, and its message links to the run.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from jobs.admin.base import actor_of
from runs import services
from runs.models import DeadRun, JobRun

# What each operation does, as the confirmation page says it.
CONSEQUENCES = {
    "replay": "Each run goes back to the queue under its own run key and runs again as its next "
    "attempt; its attempt history is kept, and the target sees the same Idempotency-Key. "
    "Only dead and cancelled runs are replayed.",
    "cancel": "Queued and retrying runs never start; a running attempt's result is dropped when "
    "it reports (the call itself is not interrupted). Finished runs are left alone.",
}
CONFIRM_LISTED = 50  # runs named on a bulk confirmation page; the rest are counted


class RunOperations:
    """Mixed into the runs' ModelAdmins; `can_operate` is theirs."""

    def _confirm(
        self,
        request: HttpRequest,
        *,
        operation: str,
        runs: list,
        total: int,
        back_url: str,
        bulk: str = "",
        selected: list[int] = (),
    ) -> TemplateResponse:
        """The page that asks before `operation` changes `runs`: it says what will happen,
        and its Yes posts back (to the same URL, or with the bulk action and its ids)."""
        context = {
            **self.admin_site.each_context(request),
            "title": f"{operation.capitalize()} {total} run{'s' if total != 1 else ''}?",
            "opts": self.opts,
            "operation": operation,
            "consequence": CONSEQUENCES[operation],
            "runs": runs,
            "more": total - len(runs),
            "bulk_action": bulk,
            "selected": [str(pk) for pk in selected],
            "back_url": back_url,
        }
        return TemplateResponse(request, "admin/runs/operate_confirm.html", context)

    def _bulk_confirmed(self, request: HttpRequest, queryset, operation: str, action: str):
        """None when the bulk action was confirmed; the confirmation page otherwise."""
        if request.POST.get("confirmed") == "yes":
            return None
        ids = list(queryset.values_list("id", flat=True))
        runs = list(JobRun.objects.filter(id__in=ids).order_by("scheduled_at")[:CONFIRM_LISTED])
        # Every selected id is posted back, not only the ones listed.
        return self._confirm(
            request,
            operation=operation,
            runs=runs,
            total=len(ids),
            back_url=request.get_full_path(),
            bulk=action,
            selected=ids,
        )

    def _log(self, request: HttpRequest, ids: list[int], message: str) -> None:
        # Logged against JobRun even from the dead-letter page, so a run's history page
        # shows every change whichever list it was made from.
        for run in JobRun.objects.filter(id__in=ids):
            self.log_change(request, run, message)

    def _bulk(self, request: HttpRequest, queryset, service, *, log: str, summary: str) -> None:
        """One bulk service call (replay, cancel) on the selected runs, logged and reported."""
        result = service(ids=list(queryset.values_list("id", flat=True)), actor=actor_of(request))
        self._log(request, result.done, log)
        self.message_user(
            request,
            summary.format(done=len(result.done), ignored=result.ignored),
            messages.SUCCESS if result.done else messages.WARNING,
        )

    @admin.action(description="Replay selected dead/cancelled runs…", permissions=["change"])
    def replay_selected(self, request: HttpRequest, queryset) -> HttpResponse | None:
        if (page := self._bulk_confirmed(request, queryset, "replay", "replay_selected")) is not None:
            return page
        self._bulk(
            request,
            queryset,
            services.replay_runs,
            log="Replayed: re-queued under the same run key.",
            summary="Replayed {done} run(s); ignored {ignored} that were not dead or cancelled.",
        )

    @admin.action(description="Replay selected: dry run (list only, change nothing)", permissions=["change"])
    def replay_selected_dry_run(self, request: HttpRequest, queryset) -> None:
        plan = services.plan_replay_runs(ids=list(queryset.values_list("id", flat=True)))
        keys = [run.run_key for run in JobRun.objects.filter(id__in=plan.done).order_by("id")]
        listed = ", ".join(keys[:20]) + (f" and {len(keys) - 20} more" if len(keys) > 20 else "")
        self.message_user(
            request,
            f"Dry run: would replay {len(keys)} run(s){': ' + listed if keys else ''}; "
            f"would ignore {plan.ignored} that are not dead or cancelled. Nothing was changed.",
            messages.INFO,
        )

    @admin.action(description="Cancel selected queued/retrying/running runs…", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset) -> HttpResponse | None:
        if (page := self._bulk_confirmed(request, queryset, "cancel", "cancel_selected")) is not None:
            return page
        self._bulk(
            request,
            queryset,
            services.cancel_runs,
            log="Cancelled.",
            summary="Cancelled {done} run(s); ignored {ignored} that were already finished.",
        )

    def _operate(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """GET asks (the confirmation page), POST does it."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not self.can_operate(request):
            raise PermissionDenied
        run = self.get_object(request, object_id)
        if run is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        from_list = self.model is DeadRun and request.GET.get("from") == "list"
        if request.method == "GET":
            back = reverse("admin:runs_deadrun_changelist" if from_list else "admin:runs_jobrun_change",
                           args=[] if from_list else [run.pk])  # fmt: skip
            return self._confirm(request, operation=operation, runs=[run], total=1, back_url=back)
        service = services.replay_run if operation == "replay" else services.cancel_run
        try:
            service(job_id=run.job_id, scheduled_at=run.scheduled_at, actor=actor_of(request))
        except services.RunConflict as exc:
            self.message_user(request, str(exc), messages.ERROR)
        except services.RunNotFound:
            self.message_user(request, "The run no longer exists.", messages.ERROR)
        else:
            verb = "Replayed: re-queued under the same run key." if operation == "replay" else "Cancelled."
            self._log(request, [run.pk], verb)
            url = reverse("admin:runs_jobrun_change", args=[run.pk])
            self.message_user(
                request, format_html('{} <a href="{}">{}</a>', verb, url, run.run_key), messages.SUCCESS
            )
        if from_list:
            # Replayed from its row in the dead-letter queue: back to the queue, where
            # the message says what happened and the next dead run is one click away.
            return HttpResponseRedirect(reverse("admin:runs_deadrun_changelist"))
        # A replayed run leaves the dead-letter queue: show it in the runs list.
        return HttpResponseRedirect(reverse("admin:runs_jobrun_change", args=[run.pk]))

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._operate(request, object_id, "replay")

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._operate(request, object_id, "cancel")
