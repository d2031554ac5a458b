import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0008_dst_policy"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="weight",
            field=models.PositiveIntegerField(
                default=1,
                help_text="Share of executor slots relative to other tenants with due runs.",
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=models.Q(("weight__gte", 1)), name="tenants_weight_positive"
            ),
        ),
    ]
