from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0004_occurrence_ledger'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='jitter_seconds',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
