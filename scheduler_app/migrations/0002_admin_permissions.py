"""The admin's permission to change task handlers, separate from editing schedules."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_app", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="task",
            options={
                "ordering": ["id"],
                "permissions": [
                    ("change_task_handler", "Can change task handlers (JavaScript code, HTTP targets)")
                ],
            },
        ),
    ]
