"""engine/messages.py: a job's custom messages become at most
custom_messages_per_window rows per window; the rest are dropped, counted,
and told in one row (when the window ends, or before the job ends)."""

import copy

from trainwarden.engine import replay_decision, step
from trainwarden.events import DecisionKind, Reason, SdkOp, Tick
from tests.builders import PACK, Job

PER_WINDOW = PACK.custom_messages_per_window
WINDOW_S = PACK.custom_messages_window_s


def _messages(job: Job, count: int, name: str = "worker-0") -> list:
    decisions = []
    for i in range(count):
        decisions += job.sdk(name, SdkOp.CUSTOM_MESSAGE, content=f"message {i}")
    return decisions


def _dropped_rows(decisions) -> list:
    return [d for d in decisions if d.rule == "custom_messages_dropped"]


def test_1000_custom_messages_in_a_second_make_the_windows_rows_and_one_row_that_counts_the_rest():
    job = Job("")
    job.at(1.0)
    decisions = _messages(job, 1000)
    assert len(decisions) == PER_WINDOW
    assert all(d.kind is DecisionKind.NOTIFY and d.reason is Reason.CUSTOM_MESSAGE for d in decisions)
    assert [d.error_message for d in decisions] == [f"message {i}" for i in range(PER_WINDOW)]
    assert job.at(1.0 + WINDOW_S - 0.1).tick() == []  # the window is still open
    told = job.at(1.0 + WINDOW_S).tick()
    assert len(told) == 1 and told[0].kind is DecisionKind.NOTIFY and told[0].reason is Reason.CUSTOM_MESSAGE
    assert told[0].error_message.startswith(f"{1000 - PER_WINDOW} custom messages of this job dropped: more than "
                                            f"{PER_WINDOW} in {WINDOW_S:g} s"), told[0].error_message
    assert job.state.messages_dropped == 0 and job.state.messages_dropped_total == 1000 - PER_WINDOW
    assert job.at(2 * WINDOW_S).tick() == []  # told once


def test_a_message_after_the_window_opens_a_new_one_after_the_count_of_the_old():
    job = Job("")
    _messages(job.at(0.0), PER_WINDOW + 5)
    later = job.at(WINDOW_S + 1).sdk("worker-1", SdkOp.CUSTOM_MESSAGE, content="next window")
    assert [d.rule for d in later] == ["custom_messages_dropped", "sdk_custom_message"]
    assert later[0].error_message.startswith("5 custom messages")
    assert later[1].error_message == "next window" and later[1].instance == "worker-1"


def test_messages_dropped_when_the_job_ends_are_told_before_its_last_decision():
    job = Job("")
    _messages(job.at(0.0), PER_WINDOW + 3)
    job.at(5.0).exit("worker-0", 0)
    ends = job.exit("worker-1", 0)
    assert [d.kind for d in ends] == [DecisionKind.NOTIFY, DecisionKind.COMPLETE_JOB]
    assert ends[0].error_message.startswith("3 custom messages")


def test_every_message_keeps_its_action_id_whichever_are_dropped():
    one, other = Job(""), Job("")
    kept = _messages(one.at(0.0), 3)
    _messages(other.at(0.0), PER_WINDOW + 10)  # other drops messages of its first window
    again = _messages(other.at(WINDOW_S), 1)[-1]
    assert len({d.action_id for d in kept}) == 3
    assert again.action_id not in {d.action_id for d in kept}  # numbered after every message, dropped ones too


def test_a_replay_that_reapplies_the_recorded_count_tells_it_once():
    # The processor replays a tick's decision from its record, not from the tick.
    job = Job("")
    _messages(job.at(0.0), PER_WINDOW + 7)
    snapshot = copy.deepcopy(job.state)
    told = job.at(WINDOW_S).tick()
    replayed = replay_decision(snapshot, told[0])
    assert replayed.messages_dropped == 0
    _, after = step(replayed, Tick(job_id=job.job_id, time=WINDOW_S), job.now + 1)
    assert _dropped_rows(after) == []


def test_the_shipped_pack_keeps_30_messages_a_minute():
    assert (PER_WINDOW, WINDOW_S) == (30, 60.0)


def test_a_rules_files_settings_change_the_custom_message_window(tmp_path):
    from trainwarden.rules.loader import load_rule_files, rule_files, shipped_rules_dir

    extra = tmp_path / "99-messages.yaml"
    extra.write_text("version: 1\nsettings:\n  custom_messages_per_window: 5\n  custom_messages_window_s: 10\n")
    pack = load_rule_files([*rule_files(shipped_rules_dir()), extra])
    assert (pack.custom_messages_per_window, pack.custom_messages_window_s) == (5, 10.0)
