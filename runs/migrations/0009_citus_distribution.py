"""On a database with the citus extension, distribute jobs and its satellites by
partition_id (co-located) and make tenants a reference table; on plain PostgreSQL,
nothing. Detected from pg_extension, so there is no setting to forget.

Must come after every migration that changed their keys (jobs 0011, runs 0008): Citus
refuses to distribute a table whose unique keys lack the distribution column. Later
migrations may ALTER these tables as usual: Citus propagates DDL to the shards.
"""

from django.db import migrations


def distribute(apps, schema_editor):
    from scheduler_project.citus import distribute

    with schema_editor.connection.cursor() as cursor:
        distribute(cursor)


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_partition_keys"), ("jobs", "0011_partition_keys")]

    operations = [migrations.RunPython(distribute, migrations.RunPython.noop, elidable=False)]
