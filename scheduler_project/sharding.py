"""Models whose rows live in the shard of their `partition_id` (jobs, runs, misfires, ledger ranges).

The database key of these tables holds `partition_id` (first, but for job_runs', led
by the run id: docs/decisions/0001-run-identity.md); the Django model keeps a single-field key
because the admin refuses CompositePrimaryKey. Django's save() of an existing row is
`UPDATE ... SET <every column> WHERE id = %s`: on Citus that statement rewrites the
distribution column (refused: "modifying the partition value of rows is not allowed")
and, without `partition_id` in its WHERE, is sent to every shard. This mixin routes it:
the row's own `partition_id` joins the WHERE and leaves the SET list. On plain
PostgreSQL the same statement only gains a redundant, indexed condition.

`_do_update` is private to Django; no public hook adds a condition to save()'s UPDATE
(docs/decisions/0001-run-identity.md says why and what guards it:
tests/test_partition_keys.py pins its parameters).
"""

from __future__ import annotations

from django.db import models


class PartitionKeyed(models.Model):
    class Meta:
        abstract = True

    def _do_update(self, base_qs, using, pk_val, values, update_fields, forced_update):
        # Called by Model.save() for an existing row only; partition_id never changes.
        partition_id = getattr(self, "partition_id", None)
        if partition_id is not None:
            base_qs = base_qs.filter(partition_id=partition_id)
            values = [value for value in values if value[0].attname != "partition_id"]
        return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update)
