from trainwarden.classify import classify, last_exception_line, normalise
from trainwarden.rules.loader import load_rules

PACK = load_rules()


def test_numbers_paths_and_addresses_are_masked_in_a_signature():
    assert normalise("[rank3]: ValueError: bad 42 at 0xdeadbeef in /a/b/c.py") == "ValueError: bad <n> at <hex> in <path>"


def test_the_last_exception_line_skips_rank_prefixes_and_trailing_noise():
    tail = ["Traceback (most recent call last):", '  File "t.py", line 3', "[rank1]: KeyError: 'x'", "", "bye"]
    assert last_exception_line(tail) == "KeyError: 'x'"


def test_a_hardware_fault_outranks_the_nccl_errors_it_causes():
    verdict = classify(PACK, 1, ["NCCL error: unhandled cuda error", "CUDA error: uncorrectable ECC error encountered"])
    assert verdict.retryable and verdict.category == "gpu_hardware"


def test_cuda_oom_is_not_retryable():
    verdict = classify(PACK, 1, ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"])
    assert not verdict.retryable and verdict.rule == "cuda_out_of_memory"


def test_a_sigkill_without_a_log_is_a_retryable_platform_signal():
    verdict = classify(PACK, 137, [])
    assert verdict.retryable and verdict.rule == "killed_by_platform"


def test_custom_keywords_match_case_insensitively_and_win():
    verdict = classify(PACK, 1, ["ValueError: Error_YYY in shard"], ["error_yyy"])
    assert verdict.retryable and verdict.rule == "sdk:custom_keyword"


def test_broad_user_errors_are_told_apart_by_their_message():
    a = classify(PACK, 1, ["ValueError: bad shape 3"]).signature
    b = classify(PACK, 1, ["ValueError: bad shape 4"]).signature
    c = classify(PACK, 1, ["ValueError: other thing"]).signature
    assert a == b != c


def test_only_the_bounded_tail_is_scanned():
    lines = ["RuntimeError: NCCL error"] + ["ok"] * PACK.tail_lines
    assert classify(PACK, 1, lines).rule == "fallback"


def test_an_old_warning_does_not_outrank_the_final_traceback():
    tail = ["[c10d] The client socket has failed to connect to [localhost]:29500 (errno: 111 - Connection refused).",
            "step 1", "Traceback (most recent call last):", '  File "train.py", line 10', "KeyError: 'labels'"]
    verdict = classify(PACK, 1, tail)
    assert not verdict.retryable and verdict.rule == "python_user_error"


def test_an_infrastructure_error_inside_the_final_traceback_still_wins():
    tail = ["step 9", "Traceback (most recent call last):", '  File "train.py", line 10',
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"]
    assert classify(PACK, 1, tail).rule == "nccl_error"


def test_a_remote_process_that_exited_is_aftermath_not_an_error_of_its_own():
    tail = ["Traceback (most recent call last):", '  File "train.py", line 10',
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, remote process exited "
            "or there was a network error, NCCL version 2.21.5"]
    verdict = classify(PACK, 1, tail)
    assert verdict.rule == "nccl_peer_gone" and verdict.aftermath and verdict.retryable


def test_kills_at_different_points_are_the_same_error():
    a = classify(PACK, 137, ["step 7 loss 0.3"]).signature
    b = classify(PACK, 137, ["saving checkpoint 12"]).signature
    assert a == b == "killed_by_platform"


def test_a_sigbus_is_shared_memory_that_ran_out_and_not_retryable():
    verdict = classify(PACK, 135, [])
    assert verdict.rule == "bus_error" and not verdict.retryable
    verdict = classify(PACK, 1, ["epoch 1 step 30", "Bus error (core dumped)"])
    assert verdict.rule == "shared_memory_exhausted" and not verdict.retryable


def test_torchs_words_for_a_program_bug_are_not_retryable_however_the_exception_is_printed():
    for line in ("RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors)",
                 "RuntimeError: Error(s) in loading state_dict for ResNet:",
                 "RuntimeError: Input type (torch.FloatTensor) and weight type (torch.cuda.HalfTensor) should be the same"):
        verdict = classify(PACK, 1, ["step 3", line])
        assert verdict.rule == "torch_program_error" and not verdict.retryable, line


def test_an_object_store_that_refuses_the_request_is_a_configuration_error_and_a_drive_quota_lifts():
    verdict = classify(PACK, 1, ["botocore.exceptions.ClientError: An error occurred (403) when calling the "
                                 "HeadObject operation: Forbidden"])
    assert verdict.rule == "remote_request_refused" and not verdict.retryable
    verdict = classify(PACK, 1, ["Access denied with the following error:", "Too many users have viewed or "
                                 "downloaded this file recently. Please try accessing the file again later."])
    assert verdict.rule == "remote_service_unavailable" and verdict.retryable


def test_a_driver_upgraded_under_the_node_is_a_retryable_node_fault():
    verdict = classify(PACK, 1, ["Failed to initialize NVML: Driver/library version mismatch"])
    assert verdict.rule == "gpu_not_ready" and verdict.retryable


def test_a_classifier_that_counts_anywhere_is_read_before_the_final_region_and_others_are_not():
    from trainwarden.rules.loader import load_rules as _load
    pack = _load()
    warning = ("[W ProcessGroupGloo.cpp:721] Warning: Unable to resolve hostname to a (local) address. "
               "Using the loopback address as fallback.")
    old_error = "ValueError: unsupported layout option frobnicate"
    tail = [warning, old_error, "Traceback (most recent call last):", '  File "/app/train.py", line 3, in <module>',
            "RuntimeError: Gloo connectFullMesh failed with [pair.cc:144] no error"]
    verdict = classify(pack, 1, tail)
    assert verdict.rule == "gloo_loopback_address" and verdict.matched_line == warning
    # the old ValueError (before the final traceback) does not count: its classifier is not 'anywhere'
    assert all(c.rule != "python_user_error" for c in verdict.evidence)


def test_one_pass_over_the_whole_tail_answers_for_every_suffix_of_it():
    import random
    pack = load_rules()
    index = pack.pattern_index
    pool = ["Connection reset by peer", "ValueError: bad layout", "epoch 3 step 200 loss 1.23",
            "NCCL WARN NET/IB : Got async event : port error", "No space left on device", "Killed", ""]
    shuffle = random.Random(7)
    for _ in range(200):
        tail = [shuffle.choice(pool) for _ in range(shuffle.randint(0, 12))]
        whole = index.last_match_positions(tail)
        for start in range(len(tail) + 1):
            suffix = {owner: line for owner, (i, line) in whole.items() if i >= start}
            assert suffix == index.last_matches(tail[start:])
