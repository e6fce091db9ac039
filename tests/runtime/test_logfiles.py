"""runtime/logfiles.py: an instance output file rotates at its size, keeps
``keep`` rotated files, and never deletes one that Vector may still take for
a new file (rotated out less than MIN_ROTATED_AGE_S ago)."""

from __future__ import annotations

import time

import pytest

from trainwarden.events import LogLine, Stream
from trainwarden.runtime.launcher import InstanceLogs, log_file
from trainwarden.runtime.logfiles import (
    MIB,
    MIN_ROTATED_AGE_S,
    LogFileCounters,
    LogFileLimits,
    RotatingLogFile,
    limits_from_flags,
    rotated,
)

LINE = "x" * 1023  # 1 KiB with its newline


class Wall:
    """The host's clock moved on by hand: file times stay the kernel's."""

    def __init__(self):
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


def _sizes(path):
    return {p.name: p.stat().st_size for p in sorted(path.parent.iterdir())}


def test_a_file_rotates_before_it_passes_its_size_and_keeps_the_newest_rotated_files(tmp_path):
    wall, counters = Wall(), LogFileCounters()
    path = tmp_path / "job" / "worker-0" / "r0-s0.stdout.log"
    out = RotatingLogFile(path, LogFileLimits(MIB, keep=2), counters, wall=wall)
    for round_ in range(4):
        for _ in range(1024):  # exactly 1 MiB: fills the file
            out.write_line(LINE)
        wall.ahead += MIN_ROTATED_AGE_S + 1  # every rotated file is old enough to go
    out.write_line("last")
    out.close()
    assert _sizes(path) == {"r0-s0.stdout.log": 5, "r0-s0.stdout.log.1": MIB, "r0-s0.stdout.log.2": MIB}
    assert counters.log_rotations == 4 and counters.log_lines_unwritten == 0
    assert path.read_text() == "last\n"


def test_a_rotated_file_vector_may_still_follow_is_not_deleted_the_lines_are_left_out_and_counted(tmp_path):
    wall, counters = Wall(), LogFileCounters()
    path = tmp_path / "r0-s0.stderr.log"
    out = RotatingLogFile(path, LogFileLimits(MIB, keep=1), counters, wall=wall)
    for _ in range(3 * 1024):  # three files' worth within a moment
        out.write_line(LINE)
    out.flush()
    # The live file and one rotated file are full; the rest waits for the rotated one to age.
    assert _sizes(path) == {"r0-s0.stderr.log": MIB, "r0-s0.stderr.log.1": MIB}
    assert counters.log_rotations == 1 and counters.log_lines_unwritten == 1024
    wall.ahead = MIN_ROTATED_AGE_S + 1
    out.write_line("after the pause")
    out.close()
    assert counters.log_rotations == 2
    assert path.read_text() == "after the pause\n" and rotated(path, 1).stat().st_size == MIB


def test_a_file_left_by_an_earlier_writer_is_appended_to_and_counted_against_the_size(tmp_path):
    path = tmp_path / "r0-s0.stdout.log"
    path.write_bytes(b"y" * (MIB - 10) + b"\n")
    counters = LogFileCounters()
    out = RotatingLogFile(path, LogFileLimits(MIB, keep=1), counters)
    out.write_line("does not fit")
    out.close()
    assert counters.log_rotations == 1 and path.read_text() == "does not fit\n"


def test_a_line_is_written_as_utf8_with_lone_surrogates_replaced(tmp_path):
    path = tmp_path / "r0-s0.stdout.log"
    out = RotatingLogFile(path, LogFileLimits(), LogFileCounters())
    out.write_line("ü \udcff")
    out.close()
    assert path.read_bytes() == "ü ?\n".encode()


def test_run_log_dir_files_rotate_with_the_same_implementation(tmp_path):
    errors = []
    logs = InstanceLogs(tmp_path, errors.append, LogFileLimits(MIB, keep=1))
    for _ in range(1500):
        logs.write(LogLine(job_id="j", time=0.0, instance="w", round=0, start=0, text=LINE, stream=Stream.STDOUT))
    logs.close()
    path = log_file(tmp_path, "j", "w", 0, 0, "stdout")
    assert logs.counters.log_rotations == 1 and not errors
    assert rotated(path, 1).stat().st_size == MIB and path.stat().st_size == 476 * 1024


@pytest.mark.parametrize("max_mb, keep, flag", [(0, 2, "--log-file-max-mb"), (64, 0, "--log-files-kept"),
                                                (64, 101, "--log-files-kept")])
def test_log_file_flags_out_of_range_are_refused_naming_the_flag(max_mb, keep, flag):
    limits, problem = limits_from_flags(max_mb, keep)
    assert limits is None and problem.startswith(flag)


def test_the_default_limits_are_64_mib_and_two_rotated_files():
    limits, problem = limits_from_flags(64, 2)
    assert limits == LogFileLimits() == LogFileLimits(64 * MIB, 2) and not problem


def test_run_says_at_the_end_how_many_lines_its_files_left_out(tmp_path):
    said = []
    logs = InstanceLogs(tmp_path, said.append, LogFileLimits(MIB, keep=1))
    for _ in range(3 * 1024 + 7):
        logs.write(LogLine(job_id="j", time=0.0, instance="w", round=0, start=0, text=LINE, stream=Stream.STDOUT))
    logs.close()
    assert said == ["1031 output lines were left out of the --log-dir files: they filled --log-file-max-mb x "
                    "(--log-files-kept + 1) faster than rotated files may go (the run saw every line)"]
