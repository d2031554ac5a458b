"""process_counters: each process's Prometheus counters (runs/counters.py), one row per
(process, counter, label), summed at scrape time.

No model: only runs/counters.py reads and writes it, in SQL. On Citus it stays an
ordinary table on the coordinator, like executor_nodes. The DDL is this migration's own.
"""

from django.db import migrations

FORWARD = """
CREATE TABLE process_counters (
    node_id varchar(100) NOT NULL,
    name varchar(64) NOT NULL,
    label varchar(64) NOT NULL DEFAULT '',
    value bigint NOT NULL CHECK (value >= 0),
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, name, label)
)
"""
BACKWARD = "DROP TABLE process_counters"


class Migration(migrations.Migration):
    dependencies = [("runs", "0012_target_hosts_per_tenant")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
