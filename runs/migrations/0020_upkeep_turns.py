"""upkeep_turns: whose turn it is to run a periodic upkeep that one process can run for
all of them, per upkeep (`task`): the first process to ask once `next_at` has passed
takes the turn and sets the next one (runs/execution/turns.py: the open floor upkeep
and the reaper's read of expired leases, which read every shard).

No model; on Citus an ordinary coordinator table like tenant_holds, so asking never
waits on a worker. The DDL is this migration's own.
"""

from django.db import migrations

FORWARD = """
CREATE TABLE upkeep_turns (
    task varchar(50) PRIMARY KEY,
    next_at timestamptz NOT NULL
)
"""
BACKWARD = "DROP TABLE upkeep_turns"


class Migration(migrations.Migration):
    dependencies = [("runs", "0019_tenant_open_floors")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
