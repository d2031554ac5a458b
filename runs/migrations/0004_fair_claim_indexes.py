"""Indexes of the fair-share claim (runs/execution/claims.py): per tenant, its best runnable run
(priority order) and its longest-waiting one (not_before order, for aging and for
finding the tenants with due runs). They replace the global claim-order index, which
only the old "top N of the whole queue" claim walked."""

from django.db import migrations

FORWARD = """
CREATE INDEX IF NOT EXISTS job_runs_tenant_claim_idx ON job_runs (tenant_id, priority DESC, scheduled_at)
    WHERE status IN ('queued', 'retrying');
CREATE INDEX IF NOT EXISTS job_runs_tenant_waiting_idx ON job_runs (tenant_id, not_before)
    WHERE status IN ('queued', 'retrying');
DROP INDEX IF EXISTS job_runs_claimable_idx;
"""

BACKWARD = """
CREATE INDEX IF NOT EXISTS job_runs_claimable_idx ON job_runs (priority DESC, scheduled_at)
    WHERE status IN ('queued', 'retrying');
DROP INDEX IF EXISTS job_runs_tenant_waiting_idx;
DROP INDEX IF EXISTS job_runs_tenant_claim_idx;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0003_executor_nodes"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
