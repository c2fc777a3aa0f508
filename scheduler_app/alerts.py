"""Telling people when an execution needs them: the execution_unknown and execution_failed signals,
and, when ALERTS asks for it, a mail to the ADMINS, at most one per kind and interval cluster-wide."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.core.mail import mail_admins
from django.urls import NoReverseMatch, reverse

from scheduler_app import signals
from scheduler_app.conf import scheduler_settings
from scheduler_app.models import Execution, Status
from scheduler_app.retention import take_turn

logger = logging.getLogger("scheduler_app")

SIGNALS: dict[str, Any] = {Status.UNKNOWN: signals.execution_unknown, Status.FAILED: signals.execution_failed}
WHAT: dict[str, str] = {
    Status.UNKNOWN: "is unknown: an operator must resolve it",
    Status.FAILED: "failed with no attempt left",
}


def ended(execution: Execution, status: str, now: datetime) -> None:
    """Send the signal of an execution just recorded ``unknown``, or ``failed`` for good; a receiver
    that raises is logged, never passed on to the runner."""
    signal = SIGNALS.get(status)
    if signal is None:
        return
    for _receiver, answer in signal.send_robust(sender=Execution, execution=execution, now=now):
        if isinstance(answer, Exception):
            logger.error(
                "a receiver of %s failed for %s: %s",
                "execution_unknown" if status == Status.UNKNOWN else "execution_failed",
                execution.occurrence_id,
                type(answer).__name__,
            )


def mail_the_admins(sender: Any, execution: Execution, now: datetime, signal: Any, **kwargs: Any) -> None:
    """The receiver of both signals: a mail to ADMINS when ALERTS["MAIL_ADMINS"] names the status,
    unless one went out for that status within ALERTS["EVERY_SECONDS"] (anywhere in the cluster)."""
    config = scheduler_settings.ALERTS
    status = Status.UNKNOWN if signal is signals.execution_unknown else Status.FAILED
    if status not in (config.get("MAIL_ADMINS") or ()):
        return
    every = timedelta(seconds=float(config["EVERY_SECONDS"]))
    if not take_turn(f"mail-{status}", now, every):
        return
    link = _admin_link(execution, str(config.get("BASE_URL") or ""))
    subject = f"scheduler: {execution.task_id} {WHAT[status].split(':')[0]}"
    body = "\n".join(
        [
            f"The execution {execution.occurrence_id} of task {execution.task_id} {WHAT[status]}.",
            f"Attempt {execution.attempt} of {execution.max_attempts}, due {execution.due_at:%Y-%m-%dT%H:%M:%SZ}.",
            f"Reason: {(execution.error or {}).get('reason') or (execution.error or {}).get('code') or '-'}",
            f"Admin page: {link}" if link else "",
            "",
            f"At most one such mail goes out every {every.total_seconds():g} s: more may have happened since;"
            " the admin's executions list (filtered by status) shows them all.",
        ]
    )
    # Sent on a thread of its own: a mail server that hangs must not hold up the runner's claims
    # and heartbeats (Django's EMAIL_TIMEOUT is None by default).
    sender_thread = threading.Thread(
        target=_send, args=(subject, body, execution.occurrence_id), name="scheduler-alert-mail", daemon=True
    )
    sender_thread.start()
    SENDING[:] = [thread for thread in SENDING if thread.is_alive()]
    SENDING.append(sender_thread)


# The mails being sent, for a caller (a test, a command) that must wait for them: join_mail().
SENDING: list[threading.Thread] = []


def join_mail(timeout: float) -> None:
    """Wait up to ``timeout`` seconds for the alert mails being sent."""
    deadline = time.monotonic() + timeout
    while SENDING:
        SENDING.pop().join(max(0.0, deadline - time.monotonic()))


def _send(subject: str, body: str, occurrence_id: Any) -> None:
    try:
        mail_admins(subject, body)
    except Exception as exc:  # a mail server down must not fail the attempt's follow-up
        logger.warning("the alert mail for %s could not be sent: %s", occurrence_id, type(exc).__name__)


def _admin_link(execution: Execution, base_url: str) -> str:
    try:
        path = reverse("admin:scheduler_app_execution_change", args=[execution.sequence])
    except NoReverseMatch:
        return ""
    return base_url.rstrip("/") + path if base_url else path
