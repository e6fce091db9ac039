"""GPU memory held by another process (evidence/memory.py): a CUDA
out-of-memory that is not the job's own is retryable elsewhere."""

from __future__ import annotations

from trainwarden.attribution import Failure, judge
from trainwarden.evidence.memory import cuda_memory_held_elsewhere, parse_cuda_oom
from trainwarden.rules.loader import load_rules
from trainwarden.rules.model import Retryability

PACK = load_rules()
SHARED = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; "
          "2.42 GiB already allocated; 26.12 MiB free; 2.75 GiB reserved in total by PyTorch)")
OWN = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB (GPU 0; 15.77 GiB total capacity; "
       "13.20 GiB already allocated; 990.00 MiB free; 14.33 GiB reserved in total by PyTorch)")
NEW_FORMAT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 290.00 MiB. GPU 0 has a total capacity "
              "of 93.00 GiB of which 134.94 MiB is free. Process 118636 has 71.62 GiB memory in use. Including "
              "non-PyTorch memory, this process has 21.24 GiB memory in use. Of the allocated memory 19.85 GiB is "
              "allocated by PyTorch, and 731.17 MiB is reserved by PyTorch but unallocated.")


def test_the_sizes_of_both_message_formats_are_read_in_gib():
    old = parse_cuda_oom(SHARED)
    assert old is not None and round(old.total, 2) == 10.76 and round(old.own, 2) == 2.75
    assert abs(old.asked - 20 / 1024) < 1e-9 and round(old.elsewhere, 1) == 8.0
    new = parse_cuda_oom(NEW_FORMAT)
    assert new is not None and new.total == 93.0 and new.own == 21.24 and round(new.elsewhere, 1) == 71.6


def test_an_out_of_memory_on_a_gpu_another_process_fills_is_retryable():
    for line in (SHARED, NEW_FORMAT):
        assert cuda_memory_held_elsewhere(["step 10", line]) is not None
        verdict = judge(PACK, [Failure("worker-0", 1, ["step 10", line])]).verdict
        assert verdict.rule == "cuda_memory_held_elsewhere" and verdict.verdict is Retryability.RETRYABLE


def test_an_out_of_memory_of_the_jobs_own_memory_stays_not_retryable():
    assert cuda_memory_held_elsewhere([OWN]) is None
    verdict = judge(PACK, [Failure("worker-0", 1, [OWN])]).verdict
    assert verdict.rule == "cuda_out_of_memory" and not verdict.retryable


def test_a_large_request_on_a_busy_gpu_is_the_jobs_own_out_of_memory():
    line = ("RuntimeError: CUDA out of memory. Tried to allocate 8.00 GiB (GPU 0; 15.78 GiB total capacity; "
            "1.00 GiB already allocated; 50.00 MiB free; 1.10 GiB reserved in total by PyTorch)")
    assert cuda_memory_held_elsewhere([line]) is None


def test_an_out_of_memory_line_that_does_not_tell_the_sizes_is_no_evidence():
    assert parse_cuda_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB") is None
    assert cuda_memory_held_elsewhere(["NPU out of memory. Tried to allocate 22.00 MiB (NPU 0; 60.97 GiB total "
                                       "capacity; 10.24 GiB already allocated; 19.52 MiB free)"]) is None


def test_the_last_out_of_memory_decides():
    assert cuda_memory_held_elsewhere([SHARED, OWN]) is None
    assert cuda_memory_held_elsewhere([OWN, SHARED]) is not None
