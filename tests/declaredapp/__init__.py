"""An app whose jobs module declares a task with @job: installed only by tests.declared_settings."""
