"""The operational decisions' edges that a timeline over the shipped pack
cannot state (rules/tests/operational.yaml has the rest): their settings,
and the evidence each failure's decision carries."""

from __future__ import annotations

import dataclasses
import shutil

from tests.builders import PACK
from trainwarden.events import DecisionKind, Reason, SdkOp
from trainwarden.rules.loader import load_rules, shipped_rules_dir
from trainwarden.simulation.cluster import VirtualCluster, instance_specs

RENDEZVOUS = "torch.distributed.DistStoreError: Timed out after 31 seconds waiting for clients. 2/3 clients joined."
KEY_ERROR = ("Traceback (most recent call last):", '  File "train.py", line 30, in training_step', "KeyError: 'x'")
NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, NCCL version 2.18.1"


def _cluster(pack=PACK, args="--enable-job-restart=True --max-num-of-job-restart=20", workers=2):
    return VirtualCluster(pack, job_id="job-1", args=args, instances=instance_specs([("worker", workers)]))


def _failures(cluster):
    return [td.decision for td in cluster.decisions if td.decision.error_source is not None]


def test_repeat_restarts_minus_one_leaves_the_same_failure_to_the_no_progress_guard():
    pack = dataclasses.replace(PACK, decisions=dataclasses.replace(PACK.decisions, repeat_restarts=-1))
    cluster = _cluster(pack)
    for _ in range(4):
        cluster.exit("worker-1", 1, [RENDEZVOUS])
    kinds = [d.kind for d in _failures(cluster)]
    assert kinds == [DecisionKind.RESTART_JOB] * 3 + [DecisionKind.FAIL_JOB]
    assert _failures(cluster)[-1].rule == "no_progress_limit"


def test_without_the_second_chance_a_first_code_error_after_progress_fails_the_job():
    pack = dataclasses.replace(PACK, decisions=dataclasses.replace(PACK.decisions, second_chance=False))
    cluster = _cluster(pack)
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=100)
    [decision] = cluster.exit("worker-0", 1, KEY_ERROR)
    assert decision.kind is DecisionKind.FAIL_JOB and decision.reason is Reason.NON_RETRYABLE_FAILURE


def test_a_category_listed_as_sure_fails_the_job_after_progress():
    sure = (*PACK.decisions.sure_categories, "user_code_error")
    pack = dataclasses.replace(PACK, decisions=dataclasses.replace(PACK.decisions, sure_categories=sure))
    cluster = _cluster(pack)
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=100)
    [decision] = cluster.exit("worker-0", 1, KEY_ERROR)
    assert decision.kind is DecisionKind.FAIL_JOB


def test_node_repeats_minus_one_never_isolates_a_node():
    pack = dataclasses.replace(PACK, decisions=dataclasses.replace(PACK.decisions, node_repeats=-1))
    cluster = _cluster(pack)
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=100)
    cluster.exit("worker-1", 1, [NCCL])
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=200)
    cluster.exit("worker-1", 1, [NCCL])
    assert [d.kind for d in _failures(cluster)] == [DecisionKind.RESTART_JOB] * 2


def test_every_failure_decision_says_which_operational_evidence_weighed():
    cluster = _cluster()
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=100)
    [first] = cluster.exit("worker-0", 1, KEY_ERROR)
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=100)
    [second] = cluster.exit("worker-0", 1, KEY_ERROR)
    assert first.evidence.startswith("phase: training (lines); progress: step 100; recurrence: first time in this "
                                     "job; node: virtual-node-worker-0")
    assert "one restart from the checkpoint" in first.evidence
    assert "no progress in its round (step 100)" in second.evidence
    assert "recurrence: 2nd time in a row without progress" in second.evidence
    assert "(2nd time in a row there)" in second.evidence


def test_an_async_instance_remembers_its_own_failures():
    cluster = _cluster(args="--job-execution-mode=Async --max-num-of-job-restart=20", workers=2)
    cluster.exit("worker-0", 1, [RENDEZVOUS])
    [other] = cluster.exit("worker-1", 1, [RENDEZVOUS])
    [again] = cluster.exit("worker-0", 1, [RENDEZVOUS])
    assert other.kind is DecisionKind.RESTART_INSTANCE
    assert again.kind is DecisionKind.FAIL_JOB and again.rule == "repeated_without_progress"


def test_a_site_file_that_changes_one_decision_setting_keeps_the_others(tmp_path):
    for shipped in sorted(shipped_rules_dir().glob("*.yaml")):
        shutil.copy(shipped, tmp_path / shipped.name)
    (tmp_path / "90-site.yaml").write_text("version: 1\nsettings:\n  decisions:\n    repeat_restarts: 2\n")
    pack = load_rules(tmp_path)
    assert pack.decisions == dataclasses.replace(PACK.decisions, repeat_restarts=2)


NODE_CONFIG = "sbatch: error: Batch job submission failed: Requested node configuration is not available"


def test_a_first_configuration_error_before_progress_says_why_it_is_restarted():
    cluster = _cluster()
    [decision] = cluster.exit("worker-0", 1, [NODE_CONFIG])
    assert decision.kind is DecisionKind.RESTART_JOB and decision.rule == "first_error_before_progress"
    assert decision.evidence.startswith("phase: initialisation (lines); no progress in its round; "
                                        "recurrence: first time in this job")
    assert "a first config_error error before any progress: one restart" in decision.evidence


def test_without_start_categories_a_configuration_error_before_progress_fails_the_job_at_once():
    pack = dataclasses.replace(PACK, decisions=dataclasses.replace(PACK.decisions, start_categories=()))
    [decision] = _cluster(pack).exit("worker-0", 1, [NODE_CONFIG])
    assert decision.kind is DecisionKind.FAIL_JOB and decision.reason is Reason.NON_RETRYABLE_FAILURE


def test_without_the_second_chance_a_first_configuration_error_before_progress_fails_the_job():
    pack = dataclasses.replace(PACK, decisions=dataclasses.replace(PACK.decisions, second_chance=False))
    [decision] = _cluster(pack).exit("worker-0", 1, [NODE_CONFIG])
    assert decision.kind is DecisionKind.FAIL_JOB


def test_a_site_file_can_list_the_categories_restarted_once_before_progress(tmp_path):
    for shipped in sorted(shipped_rules_dir().glob("*.yaml")):
        shutil.copy(shipped, tmp_path / shipped.name)
    (tmp_path / "90-site.yaml").write_text(
        "version: 1\nsettings:\n  decisions:\n    start_categories: [config_error, user_missing_file]\n")
    assert load_rules(tmp_path).decisions.start_categories == ("config_error", "user_missing_file")


BACKWARD_TWICE = ("Traceback (most recent call last):", '  File "train.py", line 52, in training_step',
                  "RuntimeError: Trying to backward through the graph a second time.")


def test_every_shipped_sure_rule_names_a_classifier_of_the_shipped_pack():
    names = {classifier.name for classifier in PACK.classifiers}
    assert PACK.decisions.sure_rules and set(PACK.decisions.sure_rules) <= names


def test_a_sure_rule_that_withholds_the_second_chance_says_so_in_the_evidence():
    cluster = _cluster()
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=100)
    [decision] = cluster.exit("worker-0", 1, BACKWARD_TWICE)
    assert decision.kind is DecisionKind.FAIL_JOB
    assert decision.evidence.endswith("; strong evidence (rule torch_program_error is one of the sure rules): "
                                      "no second chance")


def test_a_site_file_that_empties_the_sure_rules_gives_their_first_error_after_progress_its_restart(tmp_path):
    for shipped in sorted(shipped_rules_dir().glob("*.yaml")):
        shutil.copy(shipped, tmp_path / shipped.name)
    (tmp_path / "90-site.yaml").write_text("version: 1\nsettings:\n  decisions:\n    sure_rules: []\n")
    pack = load_rules(tmp_path)
    assert pack.decisions.sure_rules == ()
    cluster = _cluster(pack)
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=100)
    [decision] = cluster.exit("worker-0", 1, BACKWARD_TWICE)
    assert decision.kind is DecisionKind.RESTART_JOB and decision.rule == "first_error_after_progress"
