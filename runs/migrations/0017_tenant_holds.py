"""tenant_holds: the runs each executor holds per tenant, the count a claim on Citus
checks a tenant's max_concurrency against (runs/execution/claims.py) instead of
counting the tenant's running runs on every shard.

Each executor writes only its own rows (owner = its node id): the runs it has claimed
and not yet finished, per tenant, and until when that count holds (the leases of those
runs). A row whose `held_until` has passed (an executor that crashed or stalled) counts
for nothing. No model; on Citus an ordinary coordinator table like tenant_successes, so
a claim's check never waits on a worker. The DDL is this migration's own.
"""

from django.db import migrations

FORWARD = """
CREATE TABLE tenant_holds (
    owner varchar(100) NOT NULL,
    tenant_id bigint NOT NULL,
    running integer NOT NULL CHECK (running >= 0),
    held_until timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, owner)
)
"""
BACKWARD = "DROP TABLE tenant_holds"


class Migration(migrations.Migration):
    dependencies = [("runs", "0016_job_index_active_runs_only")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
