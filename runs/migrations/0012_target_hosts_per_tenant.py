"""Circuit breakers and retry budgets per (tenant, host): `target_hosts` gains tenant_id
in its primary key, and recovered_at (an answer closed the open breaker: the backlog's
ramp). The rows held per-host state that cannot be split among tenants; it is minutes
old by nature (a budget minute, a cool-down of at most a few minutes), so they are
deleted and every breaker starts closed.

No foreign key to tenants: on Citus `target_hosts` stays an ordinary table on the
coordinator, and a key to the reference table `tenants` would turn it into a Citus
local table. Idle rows are pruned instead.
"""

from django.db import migrations, models

FORWARD = [
    "DELETE FROM target_hosts",
    "ALTER TABLE target_hosts DROP CONSTRAINT target_hosts_pkey",
    "DROP INDEX IF EXISTS target_hosts_host_1b0a49d0_like",
    "ALTER TABLE target_hosts ADD COLUMN tenant_id bigint NOT NULL",
    "ALTER TABLE target_hosts ADD COLUMN recovered_at timestamptz NULL",
    "ALTER TABLE target_hosts ADD CONSTRAINT target_hosts_pkey PRIMARY KEY (tenant_id, host)",
]

BACKWARD = [
    "DELETE FROM target_hosts",
    "ALTER TABLE target_hosts DROP CONSTRAINT target_hosts_pkey",
    "ALTER TABLE target_hosts DROP COLUMN recovered_at",
    "ALTER TABLE target_hosts DROP COLUMN tenant_id",
    "ALTER TABLE target_hosts ADD CONSTRAINT target_hosts_pkey PRIMARY KEY (host)",
    "CREATE INDEX target_hosts_host_1b0a49d0_like ON target_hosts (host varchar_pattern_ops)",
]


class Migration(migrations.Migration):
    dependencies = [("runs", "0011_queue_indexes_without_deduplication")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AddField(
                    model_name="targethost",
                    name="tenant_id",
                    field=models.BigIntegerField(default=None),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="targethost",
                    name="recovered_at",
                    field=models.DateTimeField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name="targethost",
                    name="host",
                    field=models.CharField(help_text="scheme://host:port", max_length=300),
                ),
                migrations.AddField(
                    model_name="targethost",
                    name="pk",
                    field=models.CompositePrimaryKey(
                        "tenant_id", "host", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                migrations.AlterModelOptions(name="targethost", options={"ordering": ["tenant_id", "host"]}),
            ],
        )
    ]
