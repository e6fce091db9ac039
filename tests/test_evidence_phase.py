"""The phase a failure's lines show (trainwarden/evidence/phase.py)."""

from trainwarden.evidence.phase import failure_phase

TRACEBACK = "Traceback (most recent call last):"


def test_a_traceback_through_saving_a_checkpoint_is_the_checkpoint_phase():
    lines = ["step 900 loss 1.2", TRACEBACK, '  File "train.py", line 80, in save_checkpoint',
             "    torch.save(state, path)", "OSError: [Errno 5] Input/output error"]
    assert failure_phase(lines) == "checkpoint"


def test_a_traceback_through_the_evaluation_loop_is_the_evaluation_phase():
    lines = [TRACEBACK, '  File "trainer.py", line 3000, in evaluation_loop', "KeyError: 'labels'"]
    assert failure_phase(lines) == "evaluation"


def test_a_failure_in_backward_is_the_training_phase():
    lines = [TRACEBACK, '  File "train.py", line 12, in <module>', "    loss.backward()",
             "RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert failure_phase(lines) == "training"


def test_a_rendezvous_that_never_completes_is_initialisation():
    lines = [TRACEBACK, '  File "train.py", line 5, in <module>', "    dist.init_process_group('nccl')",
             "torch.distributed.DistNetworkError: The client socket has timed out"]
    assert failure_phase(lines) == "initialisation"


def test_where_the_failure_is_told_decides_before_steps_printed_earlier():
    lines = ["epoch 3 step 1200 loss 0.5", TRACEBACK, '  File "train.py", line 5, in <module>',
             "    model = AutoModel.from_pretrained(name)", "OSError: couldn't connect"]
    assert failure_phase(lines) == "initialisation"


def test_steps_printed_before_a_bare_kill_mean_the_training_phase():
    assert failure_phase(["{'loss': 0.41, 'learning_rate': 2e-05, 'epoch': 0.3}", "Killed"]) == "training"


def test_lines_that_name_no_phase_are_unknown():
    assert failure_phase(["Segmentation fault (core dumped)"]) == "unknown"
    assert failure_phase([]) == "unknown"


def test_a_schedulers_job_steps_are_no_training_steps():
    lines = ["slurmstepd: error: Step 1141810.0 exceeded memory limit (52917772 > 20971520), being killed",
             "srun: error: falkor7: task 0: Killed"]
    assert failure_phase(lines) == "unknown"


def test_a_step_the_scheduler_could_not_create_is_initialisation():
    assert failure_phase(["srun: error: Unable to create step for job 29986033: Memory required by task is not "
                          "available"]) == "initialisation"
