"""The console's words for runs: "runs" (not "job runs") and the catch-up trigger's label.
Labels only: no SQL runs."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0014_tenant_last_success"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="jobrun",
            options={"ordering": ["-scheduled_at"], "verbose_name": "run", "verbose_name_plural": "runs"},
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="trigger",
            field=models.CharField(
                choices=[
                    ("schedule", "Schedule"),
                    ("manual", "Manual"),
                    ("backfill", "Backfill"),
                    ("replay", "Replay"),
                    ("catch_up", "Catch-up"),
                ],
                default="schedule",
                max_length=16,
            ),
        ),
    ]
