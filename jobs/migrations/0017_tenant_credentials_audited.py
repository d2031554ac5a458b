"""Audit entries about a tenant's own credentials: issued and revoked API tokens and
rotated signing secrets, which name no job (job_id becomes nullable: DROP NOT NULL, a
catalog change only)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0016_job_starting_deadline"),
    ]

    operations = [
        migrations.AlterField(
            model_name="auditentry",
            name="action",
            field=models.CharField(
                choices=[
                    ("create", "Create"),
                    ("update", "Edit"),
                    ("pause", "Pause"),
                    ("resume", "Resume"),
                    ("trigger", "Trigger"),
                    ("backfill", "Backfill"),
                    ("replay", "Replay"),
                    ("cancel", "Cancel"),
                    ("delete", "Delete"),
                    ("issue_token", "Issue API token"),
                    ("revoke_token", "Revoke API token"),
                    ("rotate_secret", "Rotate signing secret"),
                ],
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="auditentry",
            name="job_id",
            field=models.UUIDField(blank=True, null=True),
        ),
    ]
