"""A notifier process for the kill -9 test: submits COUNT job.restarted events
(the same ones every time it starts, like a consumer replaying its input),
then delivers; with 'drain' it exits once nothing is pending."""

import sys
import time
from pathlib import Path

from trainwarden.events import Decision, DecisionKind, ErrorSource, Reason
from trainwarden.notify import JsonlDeliveryLog, Notifier, load_subscriptions

subs_dir, state_dir, count, mode = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
notifier = Notifier(load_subscriptions(subs_dir), state_dir, writer=JsonlDeliveryLog(state_dir / "deliveries.jsonl"))
for i in range(count):
    notifier.submit_decision(Decision(
        kind=DecisionKind.RESTART_JOB, reason=Reason.RETRYABLE_FAILURE, rule="r", job_id=f"job-{i}", time=time.time(),
        round=0, action_id=f"kill-test-{i}", error_source=ErrorSource.INSTANCE_EXIT))
print("submitted", flush=True)
notifier.start()
if mode == "drain":
    ok = notifier.drain(60)
    notifier.close()
    sys.exit(0 if ok else 1)
while True:
    time.sleep(1)
