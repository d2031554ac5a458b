"""Every tenant gets a signing secret: the executor signs each HTTP call with it (the
Standard Webhooks convention), and, during a rotation's overlap, with the previous one too.

Tenants that exist get a secret of their own here. It was never shown: an operator
rotates it through the API to learn it (the answer shows the new one once). The secret's
form (`whsec_` + base64 of 32 random bytes) is written out here, not imported: a
migration keeps what it did when it was written.

`tenants` is a Citus reference table: the columns, the per-row updates and the check
constraint reach every node's copy through Citus's DDL and DML propagation.
"""

import base64
import secrets

from django.db import migrations, models


def give_each_tenant_a_secret(apps, schema_editor):
    Tenant = apps.get_model("jobs", "Tenant")
    db = schema_editor.connection.alias
    for pk in Tenant.objects.using(db).filter(signing_secret="").values_list("pk", flat=True):
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        Tenant.objects.using(db).filter(pk=pk).update(signing_secret=secret)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0013_redact_audit_secrets"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="signing_secret",
            field=models.CharField(default="", editable=False, max_length=100),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="tenant",
            name="previous_signing_secret",
            field=models.CharField(blank=True, default="", editable=False, max_length=100),
        ),
        migrations.AddField(
            model_name="tenant",
            name="previous_signing_secret_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(give_each_tenant_a_secret, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=models.Q(("signing_secret__startswith", "whsec_")), name="tenants_signing_secret_set"
            ),
        ),
    ]
