"""tenant_successes: each process's newest success per tenant (runs/counters.py), for the
`cronyard_tenant_last_success_timestamp_seconds` gauge of /metrics.

The newest success of a tenant is not in any index a scrape could read cheaply: a job
row's `last_success_at` is refreshed at most once a day (runs/execution/outcomes.py),
and the newest succeeded run of a tenant is a walk back over its failing ones. So every
executor keeps the finish time of the newest success it wrote per tenant, in memory,
and flushes it with its counters into rows of its own (no two processes share a row);
/metrics reads max(at) per tenant. No model, on Citus an ordinary coordinator table like
process_counters. The DDL is this migration's own.
"""

from django.db import migrations

FORWARD = """
CREATE TABLE tenant_successes (
    node_id varchar(100) NOT NULL,
    tenant_id bigint NOT NULL,
    at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, tenant_id)
)
"""
BACKWARD = "DROP TABLE tenant_successes"


class Migration(migrations.Migration):
    dependencies = [("runs", "0013_process_counters")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
