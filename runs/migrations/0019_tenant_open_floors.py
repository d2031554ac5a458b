"""Open floors: per tenant, a lower bound on the slots of its open (queued, retrying or
running) runs, which lets a claim on Citus read only the days from it on
(runs/open_floors.py, docs/decisions/0078-open-floors.md).

- `tenants.open_floor`: the bound. For the tenants that exist already, '-infinity' (no bound) until
  the executors' upkeep first sets it; a tenant created later starts a day before its
  creation: none of its runs is open yet, and a writer lowers the floor for any run
  of an older slot than 12 hours (runs/open_floors.py, RECENT).
- `tenants.open_floor_version`: counts the writes that lowered it; the upkeep raises a
  floor only if no such write came between its reads and its own write.

Columns of the table, not of the Django model: a model save (an operator editing a
tenant) writes every field it loaded, and would put back a floor a concurrent replay
had lowered. Both have defaults, so Django's inserts need not name them. On Citus
tenants is a reference table, and ALTER TABLE reaches every copy. Catalog changes: the
columns are added with constant defaults, so no row is rewritten. The DDL is this
migration's own.
"""

from django.db import migrations

FORWARD = [
    """
    ALTER TABLE tenants
        ADD COLUMN open_floor timestamptz NOT NULL DEFAULT '-infinity',
        ADD COLUMN open_floor_version bigint NOT NULL DEFAULT 0
    """,
    "ALTER TABLE tenants ALTER COLUMN open_floor SET DEFAULT now() - interval '24 hours'",
]
BACKWARD = "ALTER TABLE tenants DROP COLUMN open_floor, DROP COLUMN open_floor_version"


class Migration(migrations.Migration):
    dependencies = [("runs", "0018_run_target_versions")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
