from django.db import migrations, models


class Migration(migrations.Migration):
    # Adding a column with a constant default: existing rows get {} (Debian cron's rule),
    # which is exactly how they were scheduled before.
    dependencies = [("jobs", "0007_jitter")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="dst_policy",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="slotrange",
            name="dst_policy",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
