"""Lexical evidence (evidence/lexical.py): what the words of a tail say,
learned from labelled failures, weighed where the catalogue's evidence is
weak."""

from __future__ import annotations

import dataclasses

import pytest

from trainwarden.attribution import Failure, judge
from trainwarden.classify import classify, weigh_words
from trainwarden.evidence.lexical import (Example, LexicalModel, WeightsError, parse_weights, tokens, train,
                                         weights_to_text)
from trainwarden.rules.lexical_file import lexical_setting
from trainwarden.rules.loader import load_rules, shipped_rules_dir
from trainwarden.rules.model import Retryability
from trainwarden.yamlsrc import ConfigError, Fields

PACK = load_rules()
# Words a catalogue has no pattern for, told apart by a model alone.
FLAKY = ("error: transport endpoint flapped while syncing shards", "failed: retry budget spent on flapped transport")
BROKEN = ("error: the option frobnicate is unsupported with this layout", "failed: unsupported layout option frobnicate")


def _toy_model(confidence: float = 0.3) -> LexicalModel:
    examples = [Example((line,), True) for line in FLAKY] * 4 + [Example((line,), False) for line in BROKEN] * 4
    return train(examples, l2=0.1, epochs=40, min_documents=1, confidence=confidence)


def test_tokens_are_the_words_and_neighbouring_pairs_of_a_line_with_numbers_paths_and_prefixes_masked():
    found = tokens(["[rank3]: Bad value 42 in /data/shard/7.bin at 0xdeadbeef: invalid", "next line failed"])
    assert {"bad", "value", "bad value", "path_", "next line", "line failed"} <= found
    assert not any(char.isdigit() for token in found for char in token)
    assert "invalid next" not in found and "rank" not in found


def test_progress_lines_are_not_read_only_the_lines_that_tell_of_a_failure():
    assert tokens(["epoch 3 step 200 loss 1.23 lr 3e-4", "saving shards"]) == frozenset()
    assert "connection" in tokens(["epoch 3 step 200 loss 1.23", "RuntimeError: connection reset by peer"])


def test_a_huge_line_costs_no_more_than_its_bounded_prefix():
    found = tokens(["error " * 1_000_000])
    assert found == {"error", "error error"}


def test_training_is_deterministic_and_learns_which_words_go_with_which_label():
    first, second = _toy_model(), _toy_model()
    assert first == second
    assert first.score(["error: transport endpoint flapped"]).retryable > 0.8
    assert first.score(["error: option frobnicate is unsupported"]).retryable < 0.2


def test_weights_round_trip_through_their_text_form_and_a_malformed_line_is_refused_by_number():
    model = _toy_model()
    assert parse_weights(weights_to_text(model.weights)) == model.weights
    for text, number, message in [("a 0.1\nA 0.2\n", 2, "is not 'word weight'"),
                                  ("a 0.1\nb nan\n", 2, "is not 'word weight'"),
                                  ("a 0.1\n\na 0.3\n", 3, "has a weight already"),
                                  ("a 1e9\n", 1, "out of range"),
                                  ("three words here 0.1\n", 1, "is not 'word weight'")]:
        with pytest.raises(WeightsError, match=message) as caught:
            parse_weights(text)
        assert caught.value.line == number


def test_where_the_catalogue_knows_nothing_a_confident_model_decides_and_names_its_words():
    pack = dataclasses.replace(PACK, lexical=_toy_model())
    verdict = classify(pack, 1, ["failed: transport endpoint flapped while syncing shards"])
    assert verdict.kind == "none"
    weighed = weigh_words(pack, verdict, ["failed: transport endpoint flapped while syncing shards"])
    assert weighed.verdict is Retryability.RETRYABLE and weighed.rule == "lexical"
    assert weighed.category == "likely_transient" and weighed.kind == "lexical"
    assert weighed.evidence[0].rule == "lexical" and "flapped" in weighed.evidence[0].line
    assert weighed.signature == verdict.signature  # the same error still counts as the same


def test_a_pattern_that_names_the_error_is_never_outweighed_by_words():
    pack = dataclasses.replace(PACK, lexical=_toy_model())
    tail = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
            "failed: transport endpoint flapped while syncing shards"]
    verdict = judge(pack, [Failure("worker-0", 1, tail)]).verdict
    assert verdict.rule == "cuda_out_of_memory" and not verdict.retryable


def test_a_model_that_is_not_confident_leaves_the_verdict_and_is_listed_as_evidence():
    pack = dataclasses.replace(PACK, lexical=_toy_model(confidence=0.4999))
    tail = ["error: something nobody has seen"]
    verdict = judge(pack, [Failure("worker-0", 1, tail)]).verdict
    assert verdict.verdict is Retryability.UNKNOWN and verdict.rule == "fallback"
    assert verdict.evidence[-1].rule == "lexical"


def test_a_rank_with_nothing_telling_does_not_become_the_root_through_its_words():
    pack = dataclasses.replace(PACK, lexical=_toy_model())
    shape_error = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
                   "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"]
    judgement = judge(pack, [Failure("worker-1", 1, shape_error, time=2.0),
                             Failure("worker-0", 1, ["failed: transport endpoint flapped while syncing shards"],
                                     time=1.0)])
    assert judgement.root.instance == "worker-1" and not judgement.verdict.retryable


def test_the_shipped_pack_weighs_the_shipped_model():
    assert PACK.lexical is not None and len(PACK.lexical.weights) > 1000
    assert "tuning set" in PACK.lexical.trained_on


def _setting(tmp_path, text: str) -> Fields:
    from trainwarden.yamlsrc import load_yaml_file
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(text)
    return Fields(load_yaml_file(rule_file)["lexical"], rule_file, "settings.lexical")


def test_a_malformed_weight_is_refused_naming_the_rule_file_and_its_line(tmp_path):
    text = "lexical:\n  bias: 0.1\n  weights: |\n    good 0.5\n    bad word here 0.1\n"
    with pytest.raises(ConfigError, match=r"rules\.yaml:5: settings\.lexical\.weights: 'bad word here 0\.1'"):
        lexical_setting(_setting(tmp_path, text))


def test_a_confidence_out_of_range_is_refused_and_a_later_file_can_switch_the_model_off(tmp_path):
    with pytest.raises(ConfigError, match=r"rules\.yaml:2: confidence must be between 0 and 0\.5"):
        lexical_setting(_setting(tmp_path, "lexical:\n  confidence: 0.9\n  bias: 0\n  weights: |\n    a 1\n"))
    with pytest.raises(ConfigError, match=r"unknown key 'wieghts'"):
        lexical_setting(_setting(tmp_path, "lexical:\n  bias: 0\n  weights: ''\n  wieghts: x\n"))
    assert lexical_setting(_setting(tmp_path, "lexical:\n  enabled: false\n")) is None


def test_the_shipped_model_is_what_training_on_the_tuning_set_gives():
    import subprocess
    import sys

    root = shipped_rules_dir().parent
    result = subprocess.run([sys.executable, str(root / "bench" / "train_lexical.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_a_tail_of_progress_lines_before_the_error_is_judged_as_the_error_alone():
    model = PACK.lexical
    error = ["RuntimeError: connection reset by peer while reading the shard from the object store"]
    progress = [f"epoch 1 step {n} loss 0.{n % 97:02d} lr 3e-4 throughput 812 samples/s" for n in range(400)]
    assert model.score(progress + error).retryable == model.score(error).retryable


def test_what_the_catalogue_found_is_a_context_token_the_model_weighs_and_is_not_regularised():
    from trainwarden.evidence.lexical import catalogue_context

    assert catalogue_context("none") == ("catalogue_none",) and catalogue_context("own") == ()
    examples = [Example(("error: something",), False, ("catalogue_none",))] * 6 + \
        [Example(("error: something",), True)] * 6
    model = train(examples, l2=100.0, epochs=40, min_documents=1, keep=1)
    assert list(model.weights) == ["catalogue_none"] and model.weights["catalogue_none"] < -1
    assert model.score(["error: something"], context=("catalogue_none",)).retryable < \
        model.score(["error: something"]).retryable


def test_a_tail_that_tells_of_no_failure_in_words_leaves_the_verdict_unknown_whatever_the_prior_says():
    model = LexicalModel(bias=-3.0, weights={"catalogue_none": -1.0, "flapped": 5.0})
    for tail in ([], ["something odd happened"], ["epoch 3 step 200 loss 1.23"]):
        assert not model.confident(model.score(tail, context=("catalogue_none",)))
    assert model.confident(model.score(["error: flapped"], context=("catalogue_none",)))
    assert model.confident(model.score(["error: never seen before"], context=("catalogue_none",)))


def test_a_death_by_signal_is_not_outweighed_by_the_words_the_process_printed_before_it():
    pack = dataclasses.replace(PACK, lexical=_toy_model())
    tail = ["failed: layout option frobnicate"]
    assert pack.lexical.score(tail).retryable < 0.2
    verdict = classify(pack, 137, tail)
    assert verdict.kind == "exit" and verdict.retryable
    assert weigh_words(pack, verdict, tail) == verdict


TORCHRUN_SUMMARY_ONLY = [
    '  File "/opt/conda/bin/torchrun", line 8, in <module>',
    '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/run.py", line 806, in main',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2024-03-05_07:01:51",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : 1 (pid: 69811)",
    "  error_file: <N/A>",
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 69811) of binary: "
    "/opt/conda/bin/python",
]


def test_a_launcher_s_summary_alone_says_a_rank_failed_not_why_and_stays_unknown():
    assert tokens(TORCHRUN_SUMMARY_ONLY) == frozenset()
    verdict = judge(PACK, [Failure("worker-0", 1, TORCHRUN_SUMMARY_ONLY)]).verdict
    assert verdict.verdict is Retryability.UNKNOWN and verdict.rule == "fallback"


def test_the_rank_s_own_error_next_to_the_launcher_s_summary_is_still_read():
    tail = ["ValueError: unsupported layout option frobnicate", *TORCHRUN_SUMMARY_ONLY]
    assert "frobnicate" in tokens(tail) and not any("childfailederror" in t for t in tokens(tail))


def test_torchelastic_s_no_error_file_note_and_an_operator_s_pod_exit_are_boilerplate_too():
    from trainwarden.evidence.ranks import launcher_boilerplate
    assert launcher_boilerplate("I0215 08:29:11.027000 485 torch/distributed/elastic/multiprocessing/errors/__init__.py:368]"
                                " ('local_rank %s FAILED with no error file. Decorate your entrypoint fn with @record', 0)")
    assert launcher_boilerplate("INFO[0289] Pod: default.kfto-01-master-0 exited with code 1  job=default.kfto-01")
    assert not launcher_boilerplate("RuntimeError: CUDA error: an illegal memory access was encountered")
