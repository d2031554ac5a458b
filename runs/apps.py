from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"
    # The console's section name (breadcrumbs, the home page): not "Jobs > Jobs".
    verbose_name = "Runs and executors"

    def ready(self) -> None:
        # The web process validates task targets against the same registry the
        # executors run (EXECUTOR_TASK_MODULES): load it at startup, in every process.
        # A module that fails to import stops the process, as it stops an executor.
        from django.conf import settings

        from runs import tasks

        tasks.load_modules(settings.EXECUTOR_TASK_MODULES)
