"""In which phase of a training job a failure happened, as its lines show it.

The phases: ``initialisation`` (imports, arguments, the process group and
rendezvous, loading the model, the data or a checkpoint: before the first
step completed), ``training`` (the training loop), ``evaluation``
(validation or evaluation), ``checkpoint`` (saving one), ``unknown`` (the
lines do not say).

The rule, in order (the first that holds decides):
1. Where the failure is told (the last traceback on, or the last 60 lines)
   a line names saving a checkpoint: ``checkpoint``.
2. There a line names evaluation or validation: ``evaluation``.
3. There a line names the training loop (a training step, backward, the
   optimizer's step, a fit loop): ``training``.
4. There a line names initialisation (the process group, rendezvous,
   loading a model, dataset or checkpoint, an import, the launcher or
   scheduler refusing to start or place it): ``initialisation``.
5. Anywhere in the lines (a scheduler's own lines aside: its job steps are
   no training steps), a step, iteration or epoch counter, a loss value or
   a progress bar shows that steps ran: ``training``.
6. Otherwise ``unknown``.

The same rule annotated the real-failure corpus (``# phase:`` of each
excerpt, tests/data/failure_corpus/README.md) and names the phase in the
engine's explanation of a decision. It never decides a verdict: the engine
judges by the progress the job reported, which it observes, not by this.

Pure; the patterns are alternations of literals (linear in the line).
"""

from __future__ import annotations

import re
from typing import Sequence

from trainwarden.evidence.ranks import strip_prefix
from trainwarden.evidence.traceback import TRACEBACK_START

PHASES = ("initialisation", "training", "evaluation", "checkpoint", "unknown")
# Without a traceback, the failure is told in this many last lines (classify.FINAL_REGION_LINES).
FINAL_LINES = 60
# A line longer than this is read in its first part only: the words that
# name a phase come early, and a job may print megabyte lines.
MAX_LINE = 2000

_CHECKPOINT = re.compile(
    r"(?i)save_checkpoint|save_pretrained|save_model|_save_checkpoint|torch\.save\(|torch/serialization\.py"
    r"|saving (?:model )?checkpoint|checkpoint saving|writing checkpoint|save_state|dcp\.save|async_save"
    r"|savez|save_weights|\bsaving model\b|in save\b|in _save\b|checkpoint_io|save_to_disk"
    r"|save_on_train_epoch_end|_save_topk_checkpoint|ModelCheckpoint")
_EVALUATION = re.compile(
    r"(?i)evaluation_loop|in evaluate\b|\.evaluate\(|prediction_step|eval_step|validation_step|_run_eval"
    r"|run_validation|in validate\b|validate\(|running evaluation|\bval(?:idation)? loop|in eval\b"
    r"|test_step|_evaluation_step|in inference_step|sanity check")
_TRAINING = re.compile(
    r"(?i)training_step|train_step|_inner_training_loop|\.backward\(|in backward\b|_engine_run_backward"
    r"|optimizer\.step|in step\b.*optim|train_one_epoch|train_epoch|in train_batch|fit_loop|run_training"
    r"|training_loop|in _training_step|forward_backward|in train_step|in training_step|loss\.backward"
    r"|in _run_train|in advance\b|in optimizer_step")
_INITIALISATION = re.compile(
    r"(?i)init_process_group|rendezvous|rdzv|TCPStore|from_pretrained|load_state_dict|load_checkpoint"
    r"|No module named|ModuleNotFoundError|ImportError|unrecognized arguments|argparse"
    r"|Loading checkpoint shards|initiali[sz]|setup_distributed|init_distributed|deepspeed\.initialize"
    r"|_get_dataset|build_dataset|load_dataset|DataLoader\(|prepare_data|sbatch: error"
    r"|srun: error: (?:Unable to (?:allocate|create step)|Task launch|Application launch|Invalid|.*still not ready)"
    r"|set_device|ncclCommInitRank|NCCL INFO Bootstrap|MASTER_ADDR|MASTER_PORT|Address already in use"
    r"|accelerator\.prepare|model\.to\(|\.cuda\(\)|in _setup|in setup\b"
    r"|resolve/main/|to load this model|invalid device ordinal|You requested GPUs|MisconfigurationException"
    r"|Requested node configuration|Batch job submission failed|ncclInvalidUsage|ncclCommInitAll|nccl_init")
_STEPS_RAN = re.compile(
    r"(?i)\b(?:global_?)?step[ =:\[]+[1-9]\d*|\biter(?:ation)?[ =:\[]+[1-9]\d*|\bepoch[ =:\[]+\d+"
    r"|\bloss[\"']?[ =:]+[\"']?-?\d|[1-9]\d*/\d+ \[\d|\d+(?:\.\d+)?(?:it/s|s/it)\]")

# A scheduler's job step ("Step 1141810.0", "StepId=191.batch") is no training step.
_SCHEDULER = re.compile(r"slurmstepd|srun: |StepId=|JOB \d+ ON ")


def _region(lines: Sequence[str]) -> Sequence[str]:
    for index in range(len(lines) - 1, -1, -1):
        if TRACEBACK_START in lines[index]:
            return lines[index:]
    return lines[-FINAL_LINES:]


def _any(pattern: "re.Pattern[str]", lines: Sequence[str]) -> bool:
    return any(pattern.search(strip_prefix(line[:MAX_LINE])) for line in lines)


def failure_phase(lines: Sequence[str]) -> str:
    """The phase the lines show the failure in (one of ``PHASES``)."""
    region = _region(lines)
    for phase, pattern in (("checkpoint", _CHECKPOINT), ("evaluation", _EVALUATION), ("training", _TRAINING),
                           ("initialisation", _INITIALISATION)):
        if _any(pattern, region):
            return phase
    counted = [line for line in lines if not _SCHEDULER.search(line[:MAX_LINE])]
    return "training" if _any(_STEPS_RAN, counted) else "unknown"
