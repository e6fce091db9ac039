"""A collective of one element that times out (evidence/collectives.py):
a barrier or a flag one rank never reached, not a network stall."""

from __future__ import annotations

from trainwarden.attribution import Failure, judge
from trainwarden.evidence.collectives import collective_timeout_one_element
from trainwarden.rules.loader import load_rules
from trainwarden.rules.model import Retryability

PACK = load_rules()


def _watchdog(seq: int, op: str, numel: int) -> str:
    return (f"[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) "
            f"ran for 600093 milliseconds before timing out.")


def test_a_one_element_all_reduce_that_times_out_is_a_barrier_timeout_and_not_retryable():
    tail = ["saving checkpoint", _watchdog(460631, "ALLREDUCE", 1)]
    assert collective_timeout_one_element(tail) is not None
    verdict = judge(PACK, [Failure("worker-0", 1, tail)]).verdict
    assert verdict.rule == "barrier_timeout" and verdict.verdict is Retryability.NOT_RETRYABLE
    assert verdict.category == "collective_misuse"


def test_a_timeout_in_a_large_collective_stays_a_retryable_collective_timeout():
    tail = [_watchdog(2143, "ALLREDUCE", 659)]
    assert collective_timeout_one_element(tail) is None
    verdict = judge(PACK, [Failure("worker-0", 1, tail)]).verdict
    assert verdict.rule == "nccl_watchdog_timeout" and verdict.retryable


def test_one_large_collective_among_the_timeouts_is_enough_to_say_it_is_not_a_barrier():
    assert collective_timeout_one_element([_watchdog(5, "ALLREDUCE", 1), _watchdog(5, "ALLREDUCE", 4096)]) is None


def test_a_one_element_work_that_did_not_time_out_is_no_evidence():
    line = "[Rank 0] ProcessGroupNCCL created WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1)"
    assert collective_timeout_one_element([line]) is None


def test_another_ranks_own_error_is_the_root_cause_and_the_barrier_timeout_its_consequence():
    own = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
           "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"]
    judgement = judge(PACK, [Failure("worker-0", 1, [_watchdog(19, "ALLREDUCE", 1)], time=1.0),
                             Failure("worker-1", 1, own, time=2.0)])
    assert judgement.root.instance == "worker-1"
    assert [j.verdict.rule for j in judgement.consequences] == ["barrier_timeout"]
