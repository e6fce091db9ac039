import pytest

from trainwarden.settings import (
    C4DLogLevel,
    ExecutionMode,
    FaultTolerantPolicy,
    JobSettings,
    SettingsError,
    parse_args_string,
)


def test_an_empty_arguments_string_gives_the_spec_defaults():
    s = parse_args_string("")
    assert s == JobSettings()
    assert s.job_execution_mode is ExecutionMode.SYNC
    assert s.enable_job_restart is False
    assert s.max_num_of_job_restart == 3
    assert s.enable_job_hang_detection is False
    assert s.job_hang_interval == 1800
    assert s.enable_c4d_hang_detection is False
    assert s.enable_job_exit_hang_detection is False
    assert s.job_exit_hang_interval == 600
    assert s.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
    assert s.max_num_of_same_error == 10
    assert s.max_tolerated_failure_rate == -1
    assert s.max_num_of_no_progress_restart == 3
    assert s.c4d_log_level is C4DLogLevel.WARNING


def test_the_string_users_already_write_is_accepted():
    s = parse_args_string("--job-execution-mode=Sync --enable-job-restart=True "
                          "--enable-job-hang-detection=True --job-hang-interval=3600")
    assert s.enable_job_restart and s.enable_job_hang_detection and s.job_hang_interval == 3600


def test_every_flag_is_accepted_in_name_equals_value_form():
    s = parse_args_string(
        "--job-execution-mode=Async --enable-job-restart=true --max-num-of-job-restart=5 "
        "--enable-job-hang-detection=TRUE --job-hang-interval=60 --enable-c4d-hang-detection=True "
        "--enable-job-exit-hang-detection=True --job-exit-hang-interval=30 --fault-tolerant-policy=OnFailure "
        "--max-num-of-same-error=2 --max-tolerated-failure-rate=0.25 --c4d-log-level=Error "
        "--c4d-common-envs=C4D_HANG_TIMEOUT=5000000,C4D_HANG_TIMES=3 --max-num-of-no-progress-restart=-1")
    assert s.job_execution_mode is ExecutionMode.ASYNC
    assert s.max_num_of_job_restart == 5 and s.job_hang_interval == 60 and s.job_exit_hang_interval == 30
    assert s.fault_tolerant_policy is FaultTolerantPolicy.ON_FAILURE
    assert s.max_num_of_same_error == 2 and s.max_tolerated_failure_rate == 0.25
    assert s.c4d_log_level is C4DLogLevel.ERROR and s.max_num_of_no_progress_restart == -1
    assert s.c4d_env()["C4D_HANG_TIMEOUT"] == "5000000" and s.c4d_env()["C4D_HANG_TIMES"] == "3"
    assert s.c4d_env()["C4D_RUNTIME_LOG_LEVEL"] == "INFO"


def test_booleans_and_choices_are_case_insensitive():
    s = parse_args_string("--enable-job-restart=tRuE --job-execution-mode=async --fault-tolerant-policy=never")
    assert s.enable_job_restart and s.job_execution_mode is ExecutionMode.ASYNC
    assert s.fault_tolerant_policy is FaultTolerantPolicy.NEVER


@pytest.mark.parametrize("text, flag, words", [
    ("--enable-job-restrat=True", "enable-job-restrat", "Unknown flag"),
    ("--enable-job-restart=yes", "enable-job-restart", "True or False"),
    ("--job-hang-interval=0", "job-hang-interval", "from 1"),
    ("--job-hang-interval=-5", "job-hang-interval", "from 1"),
    ("--job-hang-interval=ten", "job-hang-interval", "integer"),
    ("--max-num-of-job-restart=-1", "max-num-of-job-restart", "from 0"),
    ("--max-tolerated-failure-rate=1.5", "max-tolerated-failure-rate", "fraction"),
    ("--max-num-of-no-progress-restart=-2", "max-num-of-no-progress-restart", "or -1 (off)"),
    ("--job-execution-mode=Parallel", "job-execution-mode", "Sync, Async"),
    ("--fault-tolerant-policy=Always", "fault-tolerant-policy", "OnFailure, ExitCodeAndErrorMsg, Never"),
    ("--c4d-log-level=Debug", "c4d-log-level", "Info, Warning, Error"),
    ("--c4d-common-envs=C4D_FOO=1", "c4d-common-envs", "C4D_HANG_TIMEOUT"),
    ("--c4d-common-envs=C4D_HANG_TIMES=0", "c4d-common-envs", "positive"),
    ("--job-hang-interval=60 --job-hang-interval=70", "job-hang-interval", "more than once"),
    ("--enable-job-restart True", "--enable-job-restart", "--name=value"),
])
def test_a_bad_flag_is_an_error_naming_the_flag_and_the_allowed_values(text, flag, words):
    with pytest.raises(SettingsError) as caught:
        parse_args_string(text)
    assert caught.value.flag == flag
    assert words in str(caught.value)
    assert flag.lstrip("-") in str(caught.value)


@pytest.mark.parametrize("text, flag", [
    ("--max-num-of-job-restart=１２", "max-num-of-job-restart"),  # fullwidth digits, which int() reads
    ("--job-hang-interval=٣٠", "job-hang-interval"),  # Arabic-Indic digits
    ("--max-tolerated-failure-rate=０.５", "max-tolerated-failure-rate"),
    ("--max-tolerated-failure-rate=nan", "max-tolerated-failure-rate"),
    ("--c4d-common-envs=C4D_HANG_TIMEOUT=²", "c4d-common-envs"),  # isdigit() says yes, int() raises
])
def test_numbers_are_ascii_digits_only_and_anything_else_is_refused_naming_the_flag(text, flag):
    with pytest.raises(SettingsError) as caught:
        parse_args_string(text)
    assert caught.value.flag == flag
