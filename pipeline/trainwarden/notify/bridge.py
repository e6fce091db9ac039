"""Where engine decisions meet the notifier: one place that turns a decision
(and the stack report of a hang) into submitted events, for the embedded run
and for the Kafka notifier service alike.

A notification problem never reaches the job's supervision: submit errors are
counted and reported once, and what could not be sent before the run ends
stays queued on disk for the next notifier on the same directory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from trainwarden.events import Decision
from trainwarden.notify.model import SubscriptionSet
from trainwarden.notify.notifier import Notifier

# What of a stack report travels in a hang notification: enough to act on
# (who is odd, and why), not the whole report (that is in the history).
REPORT_FIELDS = ("tool", "processes", "groups", "suspects", "verdict", "missing")


@dataclasses.dataclass(frozen=True)
class NotifyOptions:
    subscriptions: SubscriptionSet
    directory: Path  # the durable queue; one notifier at a time holds it
    drain_s: float = 30.0  # at the end of a run, how long to wait for deliveries still pending


def report_summary(tool: str, processes: int, groups: int, suspects, verdict: str, missing) -> dict:
    return {"tool": tool, "processes": processes, "groups": groups, "suspects": list(suspects),
            "verdict": verdict[:2000], "missing": [m[:500] for m in list(missing)[:20]]}


class DecisionNotifications:
    """Submits the events of each decision, in decision order."""

    def __init__(self, options: NotifyOptions, writer, info: Callable[[str], None],
                 context: Optional[dict] = None):
        self.options = options
        self.info = info
        self.context = dict(context or {})
        self.failures = 0
        # QueueError (the directory is another notifier's) reaches the caller: a usage problem.
        self.notifier = Notifier(options.subscriptions, options.directory, writer=writer)
        self.notifier.start()

    def submit(self, decision: Decision, stack_report: Optional[dict] = None) -> int:
        """Queue the decision's events durably; raises when they could not be queued."""
        context = dict(self.context)
        if stack_report is not None:
            context["stack_report"] = stack_report
        return self.notifier.submit_decision(decision, context)

    def decision(self, decision: Decision, stack_report: Optional[dict] = None) -> int:
        """``submit`` for a supervisor: a failure is reported once, never raised."""
        try:
            return self.submit(decision, stack_report)
        except Exception as exc:  # noqa: BLE001 - notifying must never stop an action
            self.failures += 1
            if self.failures == 1:
                self.info(f"notification of {decision.kind.value} could not be queued: {exc!r}")
            return 0

    def close(self, release_held: bool = True) -> int:
        """Send what is pending, then stop; returns the number of deliveries
        left queued on disk. ``release_held`` sends rate-limited messages
        before their window ends (a run about to exit); a service being
        restarted keeps them held for its successor."""
        self.notifier.drain(self.options.drain_s, release_held=release_held)
        left = self.notifier.pending()
        self.notifier.close()
        if left:
            self.info(f"{left} notification deliveries still pending in {self.options.directory}; "
                      f"the next notifier on that directory sends them (trainwarden notify flush)")
        return left
