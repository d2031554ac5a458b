"""The job admin's delete confirmation (one job or the bulk action): the jobs, and how
many runs, misfires and ledger ranges go with them.

Django's own summary (`admin.utils.get_deleted_objects`) lists every related row with a
join back to `jobs` on the job id alone, which Citus refuses (distributed tables join
only on `partition_id`), and asks the read-only misfire admin for a delete permission
that `services.delete_job`, which removes those rows, does not need."""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import capfirst

from jobs.models import Job, Misfire, SlotRange
from runs.models import JobRun


class JobDeleteSummary:
    """Mixed into JobAdmin."""

    def get_deleted_objects(self, objs, request: HttpRequest):
        jobs = list(objs)
        allowed = all(self.has_delete_permission(request, job) for job in jobs)
        label = capfirst(Job._meta.verbose_name)
        to_delete = [
            format_html(
                '{}: <a href="{}">{}</a>', label, reverse("admin:jobs_job_change", args=[job.pk]), job
            )
            for job in jobs
        ]
        # Counts by the rows' own key (partition_id, job_id): one index read per shard.
        keys = {
            "partition_id__in": {job.partition_id for job in jobs},
            "job_id__in": [job.pk for job in jobs],
        }
        model_count = {Job._meta.verbose_name_plural: len(jobs)}
        for model in (JobRun, Misfire, SlotRange):
            count = model.objects.filter(**keys).count() if jobs else 0
            if count:
                model_count[model._meta.verbose_name_plural] = count
        return to_delete, model_count, set() if allowed else {Job._meta.verbose_name}, []
