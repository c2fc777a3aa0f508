from django.apps import AppConfig, apps

# The admin site's index with a warning when no runner is alive; a site that has an index template
# of its own keeps it (it can show the warning with {% scheduler_runner_warning %}).
SITE_INDEX_TEMPLATE = "admin/scheduler_app/site_index.html"


class SchedulerAppConfig(AppConfig):
    name = "scheduler_app"
    verbose_name = "Scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks, connect the signal receivers, find the @job functions and
        put the runners' warning on the admin index."""
        from scheduler_app import checks, jobs, signal_handlers  # noqa: F401

        jobs.autodiscover()
        if apps.is_installed("django.contrib.admin"):
            from django.contrib import admin

            if admin.site.index_template is None:
                admin.site.index_template = SITE_INDEX_TEMPLATE
