from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"
    # The console's section name (breadcrumbs, the home page): not "Jobs > Jobs".
    verbose_name = "Scheduling"
