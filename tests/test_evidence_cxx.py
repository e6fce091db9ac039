"""An uncaught C++ exception and the abort() that ends the process
(evidence/cxx.py), and a rank of a shared tail that says how it died."""

from __future__ import annotations

from trainwarden.attribution import Failure, judge
from trainwarden.evidence.cxx import without_abort_echo
from trainwarden.evidence.ranks import strip_prefix
from trainwarden.rules.loader import load_rules
from trainwarden.rules.model import Retryability

PACK = load_rules()

RESET = [
    "terminate called after throwing an instance of 'gloo::IoException'",
    "  what():  [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [10.0.0.7]:3977: "
    "Connection reset by peer",
    "Aborted (core dumped)",
]


def test_the_abort_after_an_uncaught_exception_is_not_a_crash_of_its_own():
    assert without_abort_echo(RESET) == RESET[:2]
    verdict = judge(PACK, [Failure("worker-1", 134, RESET)]).verdict
    assert verdict.category == "connection_lost" and verdict.rule != "segfault_text"


def test_a_shell_echo_and_faulthandler_s_words_for_the_abort_are_dropped_too():
    tail = [RESET[0], RESET[1], "Fatal Python error: Aborted",
            "/bin/bash: line 1:  4711 Aborted                 (core dumped) python train.py"]
    assert without_abort_echo(tail) == RESET[:2]


def test_an_abort_with_no_uncaught_exception_before_it_stays_evidence_of_a_crash():
    tail = ["free(): invalid pointer", "Aborted (core dumped)"]
    assert without_abort_echo(tail) == tail
    assert judge(PACK, [Failure("worker-0", 134, tail)]).verdict.verdict is Retryability.NOT_RETRYABLE


def test_an_unrecognised_exception_still_ends_in_the_verdict_of_its_signal():
    tail = ["terminate called after throwing an instance of 'foo::Bar'", "  what():  frobnication failed",
            "Aborted (core dumped)"]
    verdict = judge(PACK, [Failure("worker-0", 134, tail)]).verdict
    assert verdict.signal == 6 and verdict.kind in ("exit", "lexical")


def test_one_rank_s_exception_does_not_explain_another_rank_s_crash():
    tail = ["[1]<stderr>:terminate called after throwing an instance of 'gloo::IoException'",
            "[2]<stderr>:Segmentation fault (core dumped)", "[2]<stderr>:Aborted (core dumped)"]
    assert without_abort_echo(tail) == tail[:2] + tail[2:]


def test_horovodrun_s_rank_prefix_is_stripped_whole():
    assert strip_prefix("[3]<stderr>:Aborted (core dumped)") == "Aborted (core dumped)"
    assert strip_prefix("[1,3]<stdout>:loss 0.5") == "loss 0.5"


def test_a_rank_that_printed_killed_is_a_sigkill_whatever_the_launcher_s_exit_code():
    # horovodrun reports one exit code (134, the survivors' abort) for every rank.
    tail = ["[0]<stderr>:RuntimeError: check_rank and exit epoch=1", "[0]<stderr>:Killed",
            *(f"[1]<stderr>:{line}" for line in RESET)]
    judgement = judge(PACK, [Failure("worker-0", 134, tail)])
    assert judgement.root.rank == 0 and judgement.root.exit_code == 137
    assert judgement.verdict.signal == 9 and judgement.verdict.retryable
    assert [j.rank for j in judgement.consequences if j.rank is not None] == [1]
