"""Tasks know whether they are declared in code (TASKS or @job), and why they were disabled.

Tasks already synced from SCHEDULER_APP['TASKS'] are marked as declared there,
so that the first runner start after the upgrade keeps syncing them instead
of refusing them as tasks created by register() (check E039).
"""

from typing import Any

from django.conf import settings
from django.db import migrations, models


def mark_tasks_declared_in_settings(apps: Any, schema_editor: Any) -> None:
    declared = getattr(settings, "SCHEDULER_APP", {})
    tasks = declared.get("TASKS", []) if isinstance(declared, dict) else []
    if not isinstance(tasks, (list, tuple)):
        return
    ids = [task["id"] for task in tasks if isinstance(task, dict) and isinstance(task.get("id"), str)]
    Task = apps.get_model("scheduler_app", "Task")
    Task.objects.using(schema_editor.connection.alias).filter(id__in=ids).update(declared_in="settings")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_app", "0002_admin_permissions"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="declared_in",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "Not declared (register(), the admin or the API)"),
                    ("settings", "SCHEDULER_APP['TASKS']"),
                    ("code", "@job"),
                ],
                default="",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="task",
            name="disabled_reason",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.RunPython(mark_tasks_declared_in_settings, migrations.RunPython.noop, elidable=True),
    ]
