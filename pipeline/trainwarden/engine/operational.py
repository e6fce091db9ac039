"""What the job did before it failed, weighed beside the verdict on its lines.

A log excerpt alone cannot tell many failures apart: the same "Connection
reset" is a flaky switch in one job and a wrong address in the next; a
KeyError is a bug in one and a TPU service fault surfacing in another. A
running job tells more: whether it made progress in its round (a higher
step from the SDK's ``report_progress``; for a job that never reports, a
round of ``progress_min_run_s``), whether the same error comes back without
progress between, and on which node. The two wrong verdicts do not cost the
same: a transient failure judged not retryable loses the whole job, a
persistent one judged retryable costs a restart. So, with the rule pack's
``settings.decisions`` (rules.model.OperationalSettings), for a failed
instance judged by its lines (policy ExitCodeAndErrorMsg):

- The same failure again without progress between (before any progress in
  its round, or again at the step it failed at) after ``repeat_restarts``
  restarts of it is the job's: it fails the job (reason ``no_progress``,
  rule ``repeated_without_progress``). A configuration error before any
  progress fails at once anyway (its verdict); a transient-looking one is
  thus retried once at most, with the shipped 1. Like the no-progress
  guard, ``--max-num-of-no-progress-restart=-1`` switches it off.
- A job that made progress in its round and then fails with a
  not-retryable error it never showed before, on weak evidence, gets one
  restart from its checkpoint (reason ``first_error_after_progress``). Weak:
  the verdict's category is not one of ``sure_categories`` (errors that
  follow from the job's own code, data or memory wherever and whenever it
  runs: CUDA out of memory, a shape mismatch, a missing module, NaN, a full
  disk), and its rule is not one of ``sure_rules`` (a message only a wrong
  program, its arguments, settings or build prints: an unrecognized
  argument, no kernel image for these GPUs, autograd misuse). Progress is
  the evidence that the code and configuration worked for a while; a
  second time the error is not new and fails the job.
- Before any progress in its round, a first not-retryable error of one of
  ``start_categories`` (shipped: configuration errors) from a rule not of
  ``sure_rules`` gets one restart too (rule
  ``first_error_before_progress``): at start-up a restart costs no training
  work, and a platform not ready yet (no nodes placed, a driver not loaded,
  a rendezvous closed before late workers joined) prints what looks like
  the job's configuration. The same error again fails the job.
- The same retryable error on the same node ``node_repeats`` times in a row
  is that node's fault in a job on several nodes: the node is isolated
  (where the runtime can) and the job restarted (reason ``node_fault``);
  the same error without progress on another node after that is the
  job's (the first rule).

Every failure's decision says which of this evidence weighed (phase,
progress, recurrence, node) in ``Decision.evidence``. Pure.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from trainwarden.classify import Verdict
from trainwarden.engine.progress import made_progress
from trainwarden.engine.state import FailureMemory, InstanceState, JobState
from trainwarden.events import DecisionKind, ErrorSource, Reason
from trainwarden.evidence.phase import failure_phase
from trainwarden.rules.model import Retryability
from trainwarden.settings import ExecutionMode, FaultTolerantPolicy

# Distinct error signatures a job remembers (for "never showed before");
# past it, a new error counts as seen: no second chance, never a lost memory.
MAX_SIGNATURES = 1000
# Distinct nodes remembered for one error in a row.
MAX_NODES = 16
RESTARTS = (DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE)
# Verdicts on evidence no pattern named (classify.Candidate.kind): weak whatever the phase.
WEAK_KINDS = frozenset({"lexical", "exit", "none"})
_KIND_WORDS = {"lexical": "the words of the tail alone", "exit": "the exit code alone",
               "none": "no evidence"}


@dataclasses.dataclass(frozen=True)
class Weighed:
    """The decision after the operational evidence: what to do, why, which
    rule, whether to isolate the failed instance's node first, and the
    evidence in words."""

    intent: DecisionKind
    reason: Reason
    rule: str
    isolate_node: bool
    evidence: str


def _restart_kind(state: JobState) -> DecisionKind:
    sync = state.settings.job_execution_mode is ExecutionMode.SYNC
    return DecisionKind.RESTART_JOB if sync else DecisionKind.RESTART_INSTANCE


def _nodes(state: JobState) -> int:
    return len({inst.node for inst in state.instances.values() if inst.node})


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def remember(state: JobState, inst: InstanceState, signature: str, progressed: bool) -> FailureMemory:
    """This failure in the memory of the job (Sync: the job's previous
    failure; Async: the instance's): the same error in a row, without
    progress between, on the same node."""
    sync = state.settings.job_execution_mode is ExecutionMode.SYNC
    previous = state.last_failure if sync else inst.last_failure
    same = previous is not None and previous.signature == signature
    node = inst.node
    repeats = previous.repeats + 1 if same and not progressed else 1
    nodes = previous.nodes if same and not progressed else ()
    if node and node not in nodes and len(nodes) < MAX_NODES:
        nodes = (*nodes, node)
    node_repeats = previous.node_repeats + 1 if same and node and previous.node == node else 1
    memory = FailureMemory(signature=signature, node=node, step=state.best_step, repeats=repeats,
                           node_repeats=node_repeats, nodes=nodes)
    if sync:
        state.last_failure = memory
    else:
        inst.last_failure = memory
    return memory


def weigh(state: JobState, inst: InstanceState, verdict: Verdict, signature: str, intent: DecisionKind,
          reason: Reason, rule: str, source: ErrorSource, now: float, lines: tuple[str, ...] = ()) -> Weighed:
    """The intent for a failed instance once what the job did is weighed."""
    kind = _restart_kind(state)
    progressed = made_progress(state, kind, inst, now)
    first = signature not in state.signatures_seen
    if first and len(state.signatures_seen) < MAX_SIGNATURES:
        state.signatures_seen.add(signature)
    memory = remember(state, inst, signature, progressed)
    evidence = _describe(state, inst, memory, progressed, first, lines)
    settings = state.pack.decisions
    judged_by_lines = state.settings.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
    if source is not ErrorSource.INSTANCE_EXIT or not judged_by_lines:
        return Weighed(intent, reason, rule, False, evidence)
    if intent in RESTARTS:
        if (verdict.verdict is Retryability.RETRYABLE and verdict.category in settings.node_categories
                and settings.node_repeats > 0
                and memory.node_repeats >= settings.node_repeats and memory.node and _nodes(state) > 1):
            return Weighed(intent, Reason.NODE_FAULT, "node_fault", True,
                           evidence + f"; the same error on node {memory.node} {memory.node_repeats} times in a "
                                      "row: the node's fault")
        # --max-num-of-no-progress-restart=-1 switches the no-progress guards off, this one too.
        guarded_loop = state.settings.max_num_of_no_progress_restart >= 0
        if guarded_loop and 0 <= settings.repeat_restarts < memory.repeats:
            where = (f"on {len(memory.nodes)} nodes " if len(memory.nodes) > 1 else "")
            return Weighed(DecisionKind.FAIL_JOB, Reason.NO_PROGRESS, "repeated_without_progress", False,
                           evidence + f"; the same failure {where}{memory.repeats} times without progress "
                                      "between: the job's")
        return Weighed(intent, reason, rule, False, evidence)
    can_restart = state.settings.enable_job_restart or kind is DecisionKind.RESTART_INSTANCE
    if verdict.verdict is not Retryability.NOT_RETRYABLE or not (settings.second_chance and first and can_restart):
        return Weighed(intent, reason, rule, False, evidence)
    category = verdict.category
    sure_rule = verdict.rule in settings.sure_rules
    if sure_rule and (progressed or category in settings.start_categories):
        return Weighed(intent, reason, rule, False,
                       evidence + f"; strong evidence (rule {verdict.rule} is one of the sure rules): no second "
                                  "chance")
    if progressed and category not in settings.sure_categories:
        return Weighed(kind, Reason.SECOND_CHANCE, "first_error_after_progress", False,
                       evidence + f"; a first {category} error after progress, on weak evidence ({category} is "
                                  "not one of the sure categories): one restart from the checkpoint")
    if not progressed and category in settings.start_categories:
        return Weighed(kind, Reason.SECOND_CHANCE, "first_error_before_progress", False,
                       evidence + f"; a first {category} error before any progress: one restart, as a platform "
                                  "not ready yet looks the same at start-up")
    if not progressed and verdict.kind in WEAK_KINDS:
        return Weighed(kind, Reason.SECOND_CHANCE, "weak_evidence_before_progress", False,
                       evidence + f"; not retryable on weak evidence ({_KIND_WORDS[verdict.kind]}) before any "
                                  "progress: one restart, as for an unknown error")
    return Weighed(intent, reason, rule, False, evidence)


def _describe(state: JobState, inst: InstanceState, memory: FailureMemory, progressed: bool, first: bool,
              lines: tuple[str, ...]) -> str:
    phase = failure_phase(lines) if lines else "unknown"
    if state.best_step >= 0:
        progress = (f"progress: step {state.best_step}" if progressed
                    else f"no progress in its round (step {state.best_step})")
    else:
        progress = "progress: ran long enough" if progressed else "no progress in its round"
    if first:
        recurrence = "recurrence: first time in this job"
    elif memory.repeats > 1:
        recurrence = f"recurrence: {_ordinal(memory.repeats)} time in a row without progress"
    else:
        recurrence = "recurrence: seen before in this job, with progress since"
    node = f"node: {inst.node or 'unknown'}" + (
        f" ({_ordinal(memory.node_repeats)} time in a row there)" if memory.node_repeats > 1 else "")
    return f"phase: {phase} (lines); {progress}; {recurrence}; {node}"
