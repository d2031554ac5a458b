from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0006_job_health'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='jitter_seconds',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
