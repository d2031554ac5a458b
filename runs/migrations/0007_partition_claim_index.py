"""The per-partition claim's index (runs/execution/claims.py): a tenant's runnable runs in one
partition, best priority first. Without it the claim in one partition walked the
tenant's runs in every partition (job_runs_tenant_claim_idx) and threw away those of
other partitions: ~5,000 index entries and heap rows for 32 claimed runs at 10,000
queued. The per-tenant indexes stay: the fair-share read (runs/execution/fair_share.py) walks
them across partitions. The claim's age-ordered probe uses this index too: a tenant
has few runnable runs in one partition, and sorting them is cheaper than one more
index on every insert."""

from django.db import migrations

FORWARD = """
CREATE INDEX IF NOT EXISTS job_runs_partition_claim_idx
    ON job_runs (partition_id, tenant_id, priority DESC, scheduled_at)
    WHERE status IN ('queued', 'retrying');
"""

BACKWARD = "DROP INDEX IF EXISTS job_runs_partition_claim_idx;"


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0006_run_rate_limited_to"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
