"""Where a job's time went (goodput.account), on pinned times: the exact
figures tests/test_report_outcome.py can only bound on a real run."""

import pytest

from trainwarden.goodput import RoundSpan, account


def test_a_hung_round_counts_its_silence_and_the_steps_before_it_as_lost_and_the_rest_as_productive():
    # Round 0 starts at 100, takes 0.5 s to start up, makes steps for 1.5 s, is silent for 2 s, then
    # the hang is the fault at 104; round 1 runs to the end at 110. The restart's stages take 1 s.
    rounds = [RoundSpan(start=100.0, fault_at=104.0, startup_s=0.5, silence_s=2.0),
              RoundSpan(start=105.0, fault_at=None)]
    stages = {"detecting_s": 0.2, "stopping_s": 0.3, "restarting_s": 0.1, "starting_s": 0.4}
    spent = {s.cause: s.seconds for s in account(10.0, stages, rounds).spent}
    assert spent == pytest.approx({"productive": 5.5, "lost work": 1.5, "hang silence": 2.0, "detecting": 0.2,
                                   "stopping": 0.3, "restarting": 0.1, "starting": 0.4})


def test_a_budget_that_does_not_add_up_never_makes_productive_time_negative():
    rounds = [RoundSpan(start=0.0, fault_at=50.0, silence_s=10.0)]
    spent = {s.cause: s.seconds for s in account(20.0, {"stopping_s": 5.0}, rounds).spent}
    assert spent["productive"] == 0.0 and spent["hang silence"] == 10.0 and spent["lost work"] == 5.0
