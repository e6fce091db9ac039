"""deploy/vector/vector.yaml: the production log path, agent files -> Vector ->
trainwarden.logs. Checked here without Vector (structure, the VRL's fields
against docs/MESSAGES.md and the bus structs, the path regex run in Python);
with a vector binary on PATH, also `vector validate` and `vector test`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

from trainwarden.bus import base
from trainwarden.bus.messages import DeadLetterMessage, WireLogLine
from trainwarden.bus.serde import decode
from trainwarden.jobspec import JOB_ID_RE
from trainwarden.runtime import local, logfiles
from trainwarden.runtime.logfiles import rotated
from tests.deploy.support import (
    VECTOR_CONFIG,
    VECTOR_TESTS,
    documented_messages,
    interpolate_tree,
    load_yaml,
    object_entries,
    path_assignments,
    regex_literals,
    root_assignments,
)

SEVERAL_ENV = {"TRAINWARDEN_KAFKA": "127.0.0.1:9092", "TRAINWARDEN_NODE": "node-a"}


@pytest.fixture(scope="module")
def config() -> dict:
    return load_yaml(VECTOR_CONFIG)


@pytest.fixture(scope="module")
def path_regex(config) -> re.Pattern:
    found = regex_literals(config["transforms"]["log_line"]["source"])
    assert len(found) == 1, "the log_line transform parses the file path with exactly one parse_regex"
    # Rust's regex syntax as used there ((?P<name>...), classes, {m,n}, $) is Python's too.
    return re.compile(found[0])


def _message_fields(struct: type[msgspec.Struct]) -> set[str]:
    return {"v", "type", *struct.__struct_fields__}


def _remap_object(config: dict, name: str) -> dict[str, str]:
    source = config["transforms"][name]["source"]
    objects = root_assignments(source)
    assert len(objects) == 1, f"{name} replaces the whole event exactly once"
    assert source.rstrip().endswith(objects[0]), f"{name}: nothing may be added after the event is replaced"
    assert path_assignments(source) == [], f"{name} must build the event in one object, not field by field"
    return object_entries(objects[0])


def _agent_path(log_dir: str, job_id: str, instance: str, round_: int, start: int, stream: str) -> str:
    # As pipeline/trainwarden/services/agent.py names an incarnation's output file.
    return str(Path(log_dir) / job_id / instance / f"r{round_}-s{start}.{stream}.log")


def _emulated_log_line(path_regex: re.Pattern, path: str, text: str, read_at: float, node: str) -> bytes:
    """What the log_line transform makes of one line, computed in Python."""
    parts = path_regex.search(path)
    assert parts is not None, path
    return json.dumps({"v": 1, "type": "log_line", "job_id": parts["job_id"], "node": node,
                       "instance": parts["instance"], "round": int(parts["round"]), "start": int(parts["start"]),
                       "time": read_at, "stream": parts["stream"], "text": text}).encode()


# ------------------------------------------------------------- topology


def test_the_vector_config_parses_and_every_input_names_a_component(config):
    components = {**config["sources"], **config["transforms"], **config["sinks"]}
    for name, component in {**config["transforms"], **config["sinks"]}.items():
        for wanted in component["inputs"]:
            base_name, _, port = wanted.partition(".")
            assert base_name in components, f"{name} reads from unknown component {wanted}"
            if port:
                assert port == "dropped" and components[base_name].get("reroute_dropped") is True, wanted
    assert set(config["sources"]) == {"agent_log_files"}
    assert config["transforms"]["log_line"]["inputs"] == ["agent_log_files"]


def test_the_logs_sink_writes_to_the_logs_topic_keyed_by_job_id_with_acknowledgements_and_a_disk_buffer(config):
    sink = config["sinks"]["kafka_logs"]
    assert sink["type"] == "kafka"
    assert sink["inputs"] == ["log_line"]
    assert sink["topic"] == base.LOGS
    assert sink["key_field"] == "job_id"
    assert "TRAINWARDEN_KAFKA" in sink["bootstrap_servers"]
    assert sink["encoding"] == {"codec": "json"}
    assert sink["compression"] == "gzip"
    assert sink["acknowledgements"]["enabled"] is True
    assert sink["buffer"]["type"] == "disk"
    assert sink["buffer"]["max_size"] >= 268435488  # Vector's minimum for a disk buffer (~256 MiB)
    assert sink["buffer"]["when_full"] == "block"
    # No local delivery deadline: an outage longer than it would lose lines.
    assert sink["message_timeout_ms"] == 0


def test_both_sinks_partition_like_kafka_python_so_a_jobs_logs_meet_its_events(config):
    for name in ("kafka_logs", "kafka_deadletter"):
        options = config["sinks"][name]["librdkafka_options"]
        assert options["partitioner"] == "murmur2_random", name  # Java/kafka-python murmur2 of the key
        assert options["enable.idempotence"] == "true", name
        assert all(isinstance(value, str) for value in options.values()), "librdkafka options are strings"


def test_the_dead_letter_sink_writes_to_the_dead_letter_topic_keyed_by_service(config):
    sink = config["sinks"]["kafka_deadletter"]
    assert sink["inputs"] == ["dead_letter"]
    assert sink["topic"] == base.DEAD_LETTERS
    assert sink["key_field"] == "service"
    assert sink["acknowledgements"]["enabled"] is True
    assert sink["buffer"]["when_full"] == "block"


def test_the_file_source_reads_the_agents_log_dir_from_the_beginning_with_checkpoints(config):
    source = config["sources"]["agent_log_files"]
    assert source["type"] == "file"
    assert source["include"] == ["${TRAINWARDEN_LOG_DIR:-/var/log/trainwarden}/**/*.log"]
    assert "VECTOR_DATA_DIR" in source["data_dir"]
    assert "VECTOR_DATA_DIR" in config["data_dir"]  # the disk buffer's home
    assert source["read_from"] == "beginning"
    # Same first lines are common across instances: a checksum fingerprint
    # would merge their files.
    assert source["fingerprint"]["strategy"] == "device_and_inode"


def test_a_rotated_output_file_is_read_to_its_end_and_never_taken_for_a_new_file(config, path_regex):
    source = config["sources"]["agent_log_files"]
    live = Path(_agent_path("/var/log/trainwarden", "job-1", "worker-0", 0, 0, "stdout"))
    pattern = source["include"][0].rsplit("/", 1)[-1]
    assert live.match(pattern) and path_regex.search(str(live))
    for index in (1, 2, logfiles.MAX_KEEP):
        assert not rotated(live, index).match(pattern)  # never discovered under its rotated name
    # A renamed file is followed by its handle until read to the end: no rotate_wait limit.
    assert "rotate_wait_secs" not in source and "remove_after_secs" not in source
    # Vector remembers a finished file's inode for 60 s (and discovers files every cooldown):
    # a rotated file is deleted only later, so a new file reusing its inode is not skipped.
    assert logfiles.MIN_ROTATED_AGE_S > 60 + source["glob_minimum_cooldown_ms"] / 1000


def test_the_longest_line_an_agent_writes_is_not_discarded(config):
    # The agent cuts at MAX_LINE_BYTES raw bytes, then decodes with
    # replacement (one invalid byte -> U+FFFD, 3 bytes) and appends the marker.
    longest = local.MAX_LINE_BYTES * len("\ufffd".encode()) + len(local.TRUNCATED.encode()) + 1
    assert config["sources"]["agent_log_files"]["max_line_bytes"] >= longest


def test_the_config_needs_only_trainwarden_kafka_from_the_environment(config):
    errors: list[str] = []
    interpolate_tree(config, {}, errors)
    assert set(errors) == {"TRAINWARDEN_KAFKA"}
    errors.clear()
    rendered = interpolate_tree(config, SEVERAL_ENV, errors)
    assert errors == []
    assert rendered["sinks"]["kafka_logs"]["bootstrap_servers"] == "127.0.0.1:9092"
    assert rendered["sources"]["agent_log_files"]["include"] == ["/var/log/trainwarden/**/*.log"]
    assert 'node = "node-a"' in rendered["transforms"]["log_line"]["source"]


def test_the_vrl_is_type_checked_without_schema_definitions_in_the_legacy_namespace(config):
    # With schema definitions, .file/.message/.timestamp would be typed and the
    # VRL's "string(.message) ?? ..." fallbacks would not compile (E651).
    # The legacy namespace puts the path in .file and the annotations of
    # dropped events in .metadata.dropped; it is also the one disk buffers support.
    assert config["schema"] == {"enabled": False, "log_namespace": False}


def test_no_comment_holds_a_dollar_sign_that_old_vector_versions_would_interpolate():
    for number, line in enumerate(VECTOR_CONFIG.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            assert "$" not in line, f"vector.yaml line {number}"


# ------------------------------------------------------------ the VRL


def test_the_log_line_vrl_replaces_the_event_with_exactly_the_fields_of_the_log_line_message(config):
    entries = _remap_object(config, "log_line")
    documented = documented_messages()["log_line"]
    # Every field of the documented message, and nothing else (Vector's own
    # file, host, message, source_type and timestamp are dropped with the old event).
    assert set(entries) == set(documented)
    assert set(entries) == _message_fields(WireLogLine)
    assert entries["v"] == "1"
    assert entries["type"] == '"log_line"'
    assert entries["text"].startswith("string(.message)")
    for integer in ("round", "start"):
        assert entries[integer] == f"to_int!(parts.{integer})"
    assert entries["time"].endswith("/ 1000000"), "time is float seconds"
    assert entries["node"] == "node"
    for captured in ("job_id", "instance", "stream"):
        assert entries[captured] == f"parts.{captured}"


def test_the_log_line_vrl_takes_the_node_from_the_environment_and_falls_back_to_the_host_name(config):
    source = config["transforms"]["log_line"]["source"]
    assert 'node = "${TRAINWARDEN_NODE:-}"' in source
    assert "node = get_hostname!()" in source


def test_the_dead_letter_vrl_produces_exactly_the_fields_of_the_dead_letter_message(config):
    entries = _remap_object(config, "dead_letter")
    assert set(entries) == set(documented_messages()["dead_letter"])
    assert set(entries) == _message_fields(DeadLetterMessage)
    assert entries["type"] == '"dead_letter"'
    assert entries["topic"] == f'"{base.LOGS}"'


def test_lines_of_unmatched_paths_are_rerouted_to_the_dead_letter_topic_not_dropped(config):
    log_line = config["transforms"]["log_line"]
    assert log_line["drop_on_abort"] is True and log_line["reroute_dropped"] is True
    assert "abort" in log_line["source"]
    assert config["transforms"]["dead_letter_throttle"]["inputs"] == ["log_line.dropped"]
    assert config["transforms"]["dead_letter"]["inputs"] == ["dead_letter_throttle"]


# ------------------------------------------- the path regex, run in Python


def test_the_path_regex_names_the_five_parts_of_an_output_file(path_regex):
    assert set(path_regex.groupindex) == {"job_id", "instance", "round", "start", "stream"}


@pytest.mark.parametrize("log_dir", ["/var/log/trainwarden", "/data/tw logs", "relative/logs", "/"])
@pytest.mark.parametrize("job_id,instance,round_,start,stream", [
    ("j1", "worker-1", 0, 0, "stdout"),
    ("resnet-42.v2", "ps-1", 12, 3, "stderr"),
    ("A_b.c-d", "chief-0", 999999999, 7, "stdout"),
    ("x" * 128, "evaluator-4095", 1, 0, "stderr"),
])
def test_the_path_regex_parses_every_file_an_agent_writes(path_regex, log_dir, job_id, instance, round_, start,
                                                          stream):
    assert JOB_ID_RE.match(job_id), "the sample is a valid job id"
    parts = path_regex.search(_agent_path(log_dir, job_id, instance, round_, start, stream))
    assert parts is not None
    assert (parts["job_id"], parts["instance"], int(parts["round"]), int(parts["start"]), parts["stream"]) == \
        (job_id, instance, round_, start, stream)


@pytest.mark.parametrize("path", [
    "/var/log/trainwarden/j1/worker-1/notes.log",
    "/var/log/trainwarden/j1/worker-1/r0-s0.stdin.log",
    "/var/log/trainwarden/j1/worker-1/r0-s0.stdout.txt",
    "/var/log/trainwarden/j1/worker-1/r0-s0.stdout.log.1",
    "/var/log/trainwarden/j1/worker-1/r-1-s0.stdout.log",
    "/var/log/trainwarden/j1/worker-1/rX-s0.stdout.log",
    "/var/log/trainwarden/j1/worker-1/r0.stdout.log",
    "/var/log/trainwarden/j1/xr0-s0.stdout.log",
    "/var/log/trainwarden/.hidden/worker-1/r0-s0.stdout.log",
    "/var/log/trainwarden/j1/worker-1/r1234567890-s0.stdout.log",
])
def test_the_path_regex_rejects_files_that_are_not_agent_output(path_regex, path):
    assert path_regex.search(path) is None


def test_a_line_shipped_by_vector_decodes_as_a_log_line_on_the_logs_topic(path_regex):
    path = _agent_path("/var/log/trainwarden", "j1", "worker-1", 2, 1, "stderr")
    value = _emulated_log_line(path_regex, path, "RuntimeError: NCCL error …[line truncated]", 1764400000.125,
                               "node-a")
    message = decode(base.LOGS, value)
    assert message == WireLogLine(job_id="j1", node="node-a", instance="worker-1", round=2, start=1,
                                  time=1764400000.125, text="RuntimeError: NCCL error …[line truncated]",
                                  stream="stderr")


def test_a_dead_letter_from_vector_decodes_on_the_dead_letter_topic(config):
    entries = _remap_object(config, "dead_letter")
    value = json.dumps({"v": 1, "type": "dead_letter", "time": 1764400000.125, "service": "vector-node-a",
                        "topic": json.loads(entries["topic"]), "partition": int(entries["partition"]),
                        "offset": int(entries["offset"]), "key": json.loads(entries["key"]),
                        "error": "not an agent output file: /var/log/trainwarden/notes.log",
                        "value": "hello"}).encode()
    assert isinstance(decode(base.DEAD_LETTERS, value), DeadLetterMessage)


# ----------------------------------------------------- the Vector unit tests


def test_the_vector_unit_tests_cover_a_stdout_line_a_stderr_line_and_an_unmatched_path(path_regex):
    tests = load_yaml(VECTOR_TESTS)["tests"]
    outcomes = []
    for case in tests:
        (given,) = case["inputs"]
        assert given["insert_at"] == "log_line"
        path = re.search(r'"file":\s*"([^"]+)"', given["source"]).group(1)
        parts = path_regex.search(path)
        if "log_line" in case.get("no_outputs_from", []):
            assert parts is None, f"{case['name']}: the Python regex must reject {path} too"
            assert [out["extract_from"] for out in case["outputs"]] == ["dead_letter"]
            outcomes.append("unmatched")
        else:
            assert parts is not None, f"{case['name']}: the Python regex must accept {path} too"
            assert [out["extract_from"] for out in case["outputs"]] == ["log_line"]
            assert case["no_outputs_from"] == ["dead_letter"]
            outcomes.append(parts["stream"])
    assert sorted(outcomes) == ["stderr", "stdout", "unmatched"]


# ------------------------------------------------------- with a real Vector

VECTOR = shutil.which("vector")
needs_vector = pytest.mark.skipif(VECTOR is None, reason="vector is not installed here")


def _vector_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **SEVERAL_ENV, "VECTOR_DATA_DIR": str(tmp_path / "data"),
            "TRAINWARDEN_LOG_DIR": str(tmp_path / "logs"), "VECTOR_LOG": "warn"}


@needs_vector
def test_vector_validate_accepts_the_config(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "logs").mkdir()
    result = subprocess.run([VECTOR, "validate", "--no-environment", str(VECTOR_CONFIG)], env=_vector_env(tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_vector
def test_vector_runs_the_unit_tests_of_the_remap(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "logs").mkdir()
    result = subprocess.run([VECTOR, "test", str(VECTOR_CONFIG), str(VECTOR_TESTS)], env=_vector_env(tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


VRL = shutil.which("vrl")
needs_vrl = pytest.mark.skipif(VRL is None, reason="vrl is not installed here (cargo install vrl)")


def _run_vrl(tmp_path: Path, program: str, event: dict) -> subprocess.CompletedProcess:
    (tmp_path / "program.vrl").write_text(program)
    (tmp_path / "event.json").write_text(json.dumps(event) + "\n")
    return subprocess.run([VRL, "--print-object", "--program", str(tmp_path / "program.vrl"), "--input",
                           str(tmp_path / "event.json")], capture_output=True, text=True, timeout=60)


def _program(config: dict, name: str) -> str:
    errors: list[str] = []
    source = interpolate_tree(config["transforms"][name]["source"], SEVERAL_ENV, errors)
    assert errors == []
    return source


@needs_vrl
def test_the_vrl_cli_turns_an_agent_line_into_the_documented_log_line(config, tmp_path):
    # JSON cannot carry a timestamp: the prelude makes one, typed "timestamp or
    # null" so that the program is still checked against a field of unknown type.
    prelude = '.timestamp = parse_timestamp("2025-11-29T07:06:40.125Z", "%+") ?? null\n'
    event = {"file": "/var/log/trainwarden/j1/worker-1/r0-s0.stdout.log", "message": "step 7 loss 0.31",
             "host": "gpu-node-7", "source_type": "file"}
    result = _run_vrl(tmp_path, prelude + _program(config, "log_line"), event)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    produced = decode(base.LOGS, json.dumps(json.loads(result.stdout)).encode())
    assert produced == WireLogLine(job_id="j1", node="node-a", instance="worker-1", round=0, start=0,
                                   time=1764400000.125, text="step 7 loss 0.31", stream="stdout")
    assert json.loads(result.stdout).keys() == documented_messages()["log_line"].keys()


@needs_vrl
def test_the_vrl_cli_aborts_on_an_unmatched_path_and_the_dead_letter_program_describes_it(config, tmp_path):
    event = {"file": "/var/log/trainwarden/j1/worker-1/notes.log", "message": "hello", "host": "gpu-node-7"}
    aborted = _run_vrl(tmp_path, _program(config, "log_line"), event)
    reason = aborted.stderr.strip()
    assert aborted.stdout.strip() == "" and event["file"] in reason
    dropped = {**event, "metadata": {"dropped": {"reason": "abort", "message": reason}}}  # as Vector annotates it
    result = _run_vrl(tmp_path, _program(config, "dead_letter"), dropped)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    letter = decode(base.DEAD_LETTERS, json.dumps(json.loads(result.stdout)).encode())
    assert (letter.service, letter.topic, letter.error, letter.value) == \
        ("vector-node-a", base.LOGS, reason, "hello")
