"""Custom messages (the SDK's ``send_custom_message``): at most
``pack.custom_messages_per_window`` per job per ``custom_messages_window_s``
become a history row and a notification each. The others are dropped and
counted, and the count is told in one row of its own (rule
``custom_messages_dropped``): when the window ends, or before the decision
that ends the job. A job that sends 1,000 messages in a second thus makes
the window's rows plus one, not 1,000 rows and 1,000 webhooks.

Pure: the window is judged on ``now``, the deciding process's clock. A
processor's replay steps events with their own times, so it may keep a few
other messages of a window than the live step did; the ones it keeps anew
are published again (at most a window's worth), none is lost.
"""

from __future__ import annotations

from trainwarden.engine.decide import make_decision
from trainwarden.engine.state import DROPPED_MESSAGES_RULE as DROPPED_RULE
from trainwarden.engine.state import JobState
from trainwarden.events import Decision, DecisionKind, ErrorSource, Reason, SdkMessage

RULE = "sdk_custom_message"


def on_custom_message(state: JobState, event: SdkMessage, now: float) -> list[Decision]:
    # Every message has its number, kept or not: a kept one's action id does not depend on the others.
    state.sdk_seq += 1
    decisions = tell_dropped(state, now)
    pack = state.pack
    if now >= state.messages_window_end:
        state.messages_window_end = now + pack.custom_messages_window_s
        state.messages_in_window = 0
    if state.messages_in_window >= pack.custom_messages_per_window:
        state.messages_dropped += 1
        state.messages_dropped_total += 1
        return decisions
    state.messages_in_window += 1
    inst = state.instances.get(event.instance)
    decisions.append(make_decision(state, DecisionKind.NOTIFY, Reason.CUSTOM_MESSAGE, RULE, now,
                                   fault_key=("sdk", state.sdk_seq), source=ErrorSource.SDK, inst=inst,
                                   message=event.content, category="custom_message", detected_at=event.time))
    return decisions


def tell_dropped(state: JobState, now: float, ending: bool = False) -> list[Decision]:
    """The row that counts the messages dropped in a window that has ended
    (or, ``ending``, in the one the job's last decision cuts short). Applying
    it sets the count back (engine/decide.py), in a replay too."""
    if not state.messages_dropped or (now < state.messages_window_end and not ending):
        return []
    pack = state.pack
    count = state.messages_dropped
    message = (f"{count} custom message{'s' if count != 1 else ''} of this job dropped: more than "
               f"{pack.custom_messages_per_window} in {pack.custom_messages_window_s:g} s "
               f"({state.messages_dropped_total} dropped in all)")
    return [make_decision(state, DecisionKind.NOTIFY, Reason.CUSTOM_MESSAGE, DROPPED_RULE, now,
                          fault_key=("sdk_dropped", state.sdk_seq), source=ErrorSource.SDK, message=message,
                          category=DROPPED_RULE)]
