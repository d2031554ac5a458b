"""Admin console for tenants, misfires and scheduler nodes; importing it registers the
jobs admin (jobs/admin/jobs.py) and the audit log (jobs/admin/audit.py) too. Writes go
through jobs.services."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import capfirst

from jobs import tenant_services
from jobs.admin import audit as _audit_page  # noqa: F401 (importing registers the page)
from jobs.admin import jobs as _job_pages  # noqa: F401 (importing registers the pages)
from jobs.admin.base import ConsoleTitles, ReadOnlyAdmin, actor_of
from jobs.admin.display import in_zone, moment_column, moment_html
from jobs.models import ApiToken, AuditEntry, Job, Misfire, SchedulerNode, Tenant
from scheduler_project import db, liveness


class ApiTokenInline(admin.TabularInline):
    model = ApiToken
    extra = 0
    can_delete = False
    fields = ("prefix", "label", "created", "last_used", "revoked")
    readonly_fields = ("prefix", "label", "created", "last_used")
    created = moment_column("created_at", description="created")
    last_used = moment_column("last_used_at", description="last used")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def get_queryset(self, request):
        # A token's name carries its tenant's slug: one join, not a tenant read per row.
        return super().get_queryset(request).select_related("tenant")


def _count_of(rows) -> Coalesce:
    """COUNT(*) of `rows` belonging to the outer tenant, as a scalar subquery."""
    counted = rows.filter(tenant=OuterRef("pk")).order_by().values("tenant").annotate(n=Count("*"))
    return Coalesce(Subquery(counted.values("n")), 0)


@admin.register(Tenant)
class TenantAdmin(ConsoleTitles, admin.ModelAdmin):
    list_display = (
        "slug",
        "name",
        "max_concurrency",
        "weight",
        "max_runs_per_minute",
        "token_count",
        "job_count",
        "created",
    )
    created = moment_column("created_at", description="created")
    search_fields = ("slug", "name")
    actions = ("issue_new_token", "rotate_signing_secret")
    inlines = (ApiTokenInline,)
    # The secrets themselves are not editable fields: no form or page carries them.
    readonly_fields = ("signing_overlap",)

    def get_queryset(self, request):
        # A correlated count (two Counts over one join would multiply jobs by tokens).
        # Tokens only: `api_tokens` lives on the coordinator, whereas Citus refuses a
        # subquery over the distributed `jobs` correlated with the `tenants` reference
        # table, on every page that reads a tenant (the list, the edit page).
        return (
            super().get_queryset(request).annotate(_tokens=_count_of(ApiToken.objects.filter(revoked=False)))
        )

    def get_changelist_instance(self, request):
        """The page's job counts in one grouped read over `jobs`, for the tenants shown."""
        changelist = super().get_changelist_instance(request)
        tenants = list(changelist.result_list)  # evaluates the page once; the template reuses it
        jobs = tenant_services.jobs_per_tenant(tenant_ids=[t.pk for t in tenants])
        for tenant in tenants:
            tenant._jobs = jobs.get(tenant.pk, 0)
        return changelist

    # --- deletion: only a tenant without jobs (tenant_services.delete_tenant says why) ---

    def get_deleted_objects(self, objs, request):
        perms_needed = set() if self.has_delete_permission(request) else {Tenant._meta.verbose_name}
        if request.POST.get("post"):
            # "Yes, I'm sure": delete_tenant counts the jobs under the tenant's lock, the one
            # check that holds, and refuses with a message (delete_view, delete_queryset);
            # the lists are the confirmation page's, which this answer does not show.
            return [], {}, perms_needed, []
        tenants = list(objs)
        jobs = tenant_services.jobs_per_tenant(tenant_ids=[t.pk for t in tenants])
        label = capfirst(Tenant._meta.verbose_name)
        to_delete = [format_html("{}: {}", label, tenant) for tenant in tenants if not jobs.get(tenant.pk)]
        protected = [
            format_html(
                '{}: <a href="{}?tenant__id__exact={}">{} job{}</a>: delete its jobs first',
                tenant,
                reverse("admin:jobs_job_changelist"),
                tenant.pk,
                jobs[tenant.pk],
                "s" if jobs[tenant.pk] != 1 else "",
            )
            for tenant in tenants
            if jobs.get(tenant.pk)
        ]
        empty = [t.pk for t in tenants if not jobs.get(t.pk)]
        model_count = {Tenant._meta.verbose_name_plural: len(empty)}
        for model, rows in (
            (ApiToken, ApiToken.objects.filter(tenant_id__in=empty)),
            (AuditEntry, AuditEntry.objects.filter(tenant_id__in=empty)),
        ):
            count = rows.count() if empty else 0
            if count:
                model_count[model._meta.verbose_name_plural] = count
        return to_delete, model_count, perms_needed, protected

    def save_formset(self, request, form, formset, change: bool) -> None:
        if formset.model is not ApiToken:
            super().save_formset(request, form, formset, change)
            return
        # `revoked` is the one thing a token row edits; it goes through the audited service.
        for token_form in formset.forms:
            if token_form.instance.pk and "revoked" in token_form.changed_data:
                tenant_services.set_token_revoked(
                    token=token_form.instance,
                    revoked=token_form.cleaned_data["revoked"],
                    actor=actor_of(request),
                )
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except tenant_services.TenantHasJobs as refused:
            # A job was created between the confirmation page and "Yes": nothing was deleted.
            self.message_user(request, f"Not deleted: {refused}.", messages.ERROR)
            return redirect(reverse("admin:jobs_tenant_change", args=[object_id]))

    def delete_model(self, request, obj: Tenant) -> None:
        tenant_services.delete_tenant(tenant=obj, actor=actor_of(request))

    def delete_queryset(self, request, queryset) -> None:
        # One service call (one transaction) per tenant: a tenant that gained a job since
        # the confirmation page is kept and named; the others are deleted.
        kept = []
        for tenant in queryset:
            try:
                tenant_services.delete_tenant(tenant=tenant, actor=actor_of(request))
            except tenant_services.TenantHasJobs:
                kept.append(tenant.slug)
        if kept:
            self.message_user(request, f"Not deleted, they have jobs: {', '.join(kept)}.", messages.ERROR)

    @admin.display(description="active tokens", ordering="_tokens")
    def token_count(self, tenant: Tenant) -> int:
        return tenant._tokens

    # Not sortable: ordering the list by it would need the correlated count back.
    @admin.display(description="jobs")
    def job_count(self, tenant: Tenant) -> int:
        return tenant._jobs

    def save_model(self, request, obj: Tenant, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        tenant, token = tenant_services.create_tenant(
            slug=obj.slug,
            name=obj.name,
            max_concurrency=obj.max_concurrency,
            weight=obj.weight,
            max_runs_per_minute=obj.max_runs_per_minute,
        )
        obj.pk = tenant.pk
        obj._state.adding = False
        obj.refresh_from_db()
        self._show_signing_secret(request, tenant, tenant.signing_secret)
        self._show_token(request, tenant, token)

    # Issuing a token hands out the tenant's API: only users who may change tenants.
    @admin.action(description="Issue a new API token (shown once)", permissions=["change"])
    def issue_new_token(self, request, queryset) -> None:
        for tenant in queryset:
            token = tenant_services.issue_token(tenant=tenant, label="admin", actor=actor_of(request))
            self._show_token(request, tenant, token)

    # Only for those who may change the tenant: the answer shows the new secret.
    @admin.action(
        description="Rotate the signing secret (shown once; the old one signs too for a while)",
        permissions=["change"],
    )
    def rotate_signing_secret(self, request, queryset) -> None:
        for tenant in queryset:
            secret, until = tenant_services.rotate_signing_secret(tenant=tenant, actor=actor_of(request))
            self._show_signing_secret(request, tenant, secret, previous_until=until)
            self.log_change(request, tenant, "Rotated the signing secret.")

    @admin.display(description="signing secret")
    def signing_overlap(self, tenant: Tenant) -> str:
        """Whether a rotation's overlap is on (on the clock the executors' claim reads);
        never a secret: each was shown once, when created or rotated."""
        if tenant.pk is None:
            return "made when the tenant is saved, and shown once then"
        until, now = tenant.previous_signing_secret_until, db.now()
        if until is None or until <= now:
            return "shown once, when made or last rotated"
        return format_html("shown once; the previous secret signs too until {}", moment_html(until, now=now))

    def _show_signing_secret(
        self, request, tenant: Tenant, secret: str, previous_until: datetime | None = None
    ) -> None:
        overlap = (
            "" if previous_until is None else f"; the previous one signs too until {in_zone(previous_until)}"
        )
        self.message_user(
            request,
            f"Signing secret for {tenant.slug} (shown once, store it now{overlap}): {secret}",
            messages.WARNING,
        )

    def _show_token(self, request, tenant: Tenant, token: str) -> None:
        self.message_user(
            request,
            f"New API token for {tenant.slug} (shown once, store it now): {token}",
            messages.WARNING,
        )


@admin.register(Misfire)
class MisfireAdmin(ReadOnlyAdmin):
    list_display = (
        "job_link",
        "detected",
        "policy",
        "missed",
        "first_missed",
        "last_missed",
        "runs_created",
    )
    # In the job's zone, like its slots everywhere else.
    detected = moment_column("detected_at", description="detected", zone=lambda m: m.job.time_zone)
    first_missed = moment_column(
        "first_missed_at", description="first missed slot", zone=lambda m: m.job.time_zone
    )
    last_missed = moment_column(
        "last_missed_at", description="last missed slot", zone=lambda m: m.job.time_zone
    )
    list_filter = ("policy",)
    # The view page: the list's fields, moments by the console's rule.
    fields = ("job_link", "detected", "policy", "missed", "first_missed", "last_missed", "runs_created")
    readonly_fields = fields
    search_fields = ("job__name",)  # as a subquery, not a join: get_search_results
    search_help_text = "Job name; a whole job id finds that job's misfires."
    # No join to jobs: the foreign key is the job id alone, and Citus joins distributed
    # tables only on partition_id. The page's jobs come in one read by id instead.
    list_select_related = False

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("job")

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(job_id=uuid.UUID(term)), False
        except ValueError:
            # A subquery, not a join: Citus plans it as its own multi-shard read.
            return queryset.filter(job_id__in=Job.objects.filter(name__icontains=term).values("id")), False

    @admin.display(description="job", ordering="job_id")
    def job_link(self, obj: Misfire) -> str:
        return str(obj.job)

    @admin.display(description="missed", ordering="missed_count")
    def missed(self, obj: Misfire) -> str:
        return f"at least {obj.missed_count}" if obj.count_is_lower_bound else str(obj.missed_count)


@admin.register(SchedulerNode)
class SchedulerNodeAdmin(ReadOnlyAdmin):
    list_title = "Scheduler nodes"
    list_display = ("node_id", "hostname", "pid", "started", "heartbeat", "alive", "partition_count")
    fields = (*list_display, "partitions")
    readonly_fields = fields
    started = moment_column("started_at", description="started")
    heartbeat = moment_column("heartbeat_at", description="last heartbeat")

    def get_queryset(self, request):
        # The one liveness rule (the schedulers' rebalancing evaluates the same SQL).
        return liveness.with_alive(super().get_queryset(request))

    @admin.display(boolean=True, description="alive", ordering="alive")
    def alive(self, node: SchedulerNode) -> bool:
        return node.alive

    @admin.display(description="partitions")
    def partition_count(self, node: SchedulerNode) -> int:
        return len(node.partitions or [])
