"""On Citus, the database's session defaults for Cronyard's short statements
(scheduler_project/citus.SESSION_DEFAULTS); on plain PostgreSQL, nothing."""

from django.db import migrations


def tune(apps, schema_editor):
    from scheduler_project.citus import tune_database

    with schema_editor.connection.cursor() as cursor:
        tune_database(cursor)


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_citus_distribution")]

    operations = [migrations.RunPython(tune, migrations.RunPython.noop, elidable=False)]
