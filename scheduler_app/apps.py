from django.apps import AppConfig


class SchedulerAppConfig(AppConfig):
    name = "scheduler_app"
    verbose_name = "Scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks, connect the signal receivers and find the @job functions."""
        from scheduler_app import checks, jobs, signal_handlers  # noqa: F401

        jobs.autodiscover()
