"""On Citus, the database's session defaults for Cronyard's short statements; on plain
PostgreSQL, nothing.

Every statement Cronyard sends is a short one: a multi-shard read (a tenant's running
runs, the claim plan, the admin's counts) touches a few rows in each shard and day
partition. With Citus's default pool (up to 16 connections per worker per statement, 1
kept open) each such read opened and closed a dozen worker connections; one connection
per worker per statement keeps them short. The values are this migration's own, as they
were when it was written: a later change is a new migration.
"""

from django.db import migrations

SESSION_DEFAULTS = {"citus.max_adaptive_executor_pool_size": "1"}


def tune(apps, schema_editor):
    """New sessions of the current database pick these defaults up."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
        if cursor.fetchone() is None:
            return
        for name, value in SESSION_DEFAULTS.items():
            # ALTER DATABASE takes no parameters: the server quotes the name and value.
            cursor.execute(
                "SELECT format('ALTER DATABASE %%I SET %%s = %%L', current_database(), %s::text, %s::text)",
                [name, value],
            )
            cursor.execute(cursor.fetchone()[0])


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_citus_distribution")]

    operations = [migrations.RunPython(tune, migrations.RunPython.noop, elidable=False)]
