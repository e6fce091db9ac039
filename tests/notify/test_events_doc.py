"""docs/EVENTS.md is the payload contract: it must agree with the code."""

from __future__ import annotations

import ast
import base64
import json
import re
import time
from pathlib import Path

import pytest

from trainwarden.notify.events import EVENT_TYPES, SCHEMA_VERSION, sample_event
from trainwarden.notify.transport import sign

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = ROOT / "docs" / "EVENTS.md"
CONFIG_PATH = ROOT / "pipeline" / "trainwarden" / "notify" / "config.py"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$", re.M)
EVENT_HEADING = re.compile(r"^`([^`]+)`$")
SEVERITY = re.compile(r"^\*\*Severity:\*\* `([^`]*)`", re.M)


def _without_code(text: str) -> str:
    """The text with fenced blocks blanked, offsets kept (a '#' comment in a block is no heading)."""
    return FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC_PATH.read_text(encoding="utf-8")


def sections(text: str, level: int) -> dict[str, str]:
    """Heading title -> its text, for headings of exactly this level (up to the
    next heading of this level or higher)."""
    plain = _without_code(text)
    marks = [(m.start(), m.end(), len(m.group(1)), m.group(2)) for m in HEADING.finditer(plain)]
    found: dict[str, str] = {}
    for i, (start, end, depth, title) in enumerate(marks):
        if depth != level:
            continue
        stop = next((s for s, _, d, _ in marks[i + 1:] if d <= level), len(text))
        assert title not in found, f"heading {title!r} appears twice"
        found[title] = text[end:stop]
    return found


def event_sections(text: str) -> dict[str, str]:
    """Event type -> its section, from the ### `type` headings under '## Event types'."""
    chapter = sections(text, 2).get("Event types")
    assert chapter is not None, "docs/EVENTS.md has no '## Event types' section"
    result = {}
    for title, body in sections(chapter, 3).items():
        match = EVENT_HEADING.match(title)
        assert match, f"heading {title!r} under 'Event types' is not an event type in backticks"
        result[match.group(1)] = body
    return result


def table_names(section: str, first_header: str | None = None) -> list[str]:
    """The backticked names in the first column of a section's tables (only of
    the tables whose first header cell is ``first_header``, when given)."""
    names = []
    header = None
    for line in _without_code(section).splitlines():
        if not line.startswith("|"):
            header = None
            continue
        if header is None:
            header = line.strip("|").split("|")[0].strip()
            continue
        match = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
        if match and (first_header is None or header == first_header):
            names.append(match.group(1))
    return names


def json_blocks(text: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(text) if m.group(1) == "json"]


def payload_fields() -> set[str]:
    keys: set[str] = set()
    for event_type in EVENT_TYPES:
        for with_details in (True, False):
            event = sample_event(event_type, with_details=with_details)
            for payload in (event.payload(), event.payload(3, event.time - 60)):
                keys |= set(payload["data"])
    return keys


# ---------------------------------------------------------------- event types


def test_every_event_type_has_a_section_in_the_order_of_event_types(doc):
    assert list(event_sections(doc)) == list(EVENT_TYPES)


def test_the_doc_names_no_event_type_that_does_not_exist(doc):
    prefixes = sorted({t.split(".")[0] for t in EVENT_TYPES}, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, prefixes)) + r")\.[a-z0-9_]+)(?![\w*/-])")
    named = {m.group(1).rstrip(".") for m in pattern.finditer(doc)}
    assert named, "the pattern found no event type at all: it is broken"
    assert sorted(named - set(EVENT_TYPES)) == []


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
def test_each_section_states_the_severity_its_type_has_in_the_code(doc, event_type):
    section = event_sections(doc).get(event_type)
    assert section is not None, f"no section for {event_type}"
    stated = SEVERITY.findall(section)
    assert stated == [EVENT_TYPES[event_type].value], f"{event_type}: severity line says {stated}"


# ---------------------------------------------------------------- envelope


def test_the_field_table_lists_every_field_of_the_payload(doc):
    envelope = sections(doc, 2).get("Envelope")
    assert envelope is not None, "docs/EVENTS.md has no '## Envelope' section"
    documented = set(table_names(envelope))
    assert {"type", "timestamp", "data"} <= documented
    missing = sorted(f"data.{k}" for k in payload_fields() if f"data.{k}" not in documented)
    assert missing == [], f"payload fields missing from the Envelope table: {missing}"


def test_the_field_table_names_no_field_the_payload_lacks(doc):
    documented = table_names(sections(doc, 2)["Envelope"])
    real = {"type", "timestamp", "data"} | {f"data.{k}" for k in payload_fields()}
    assert sorted(set(documented) - real) == []


def test_the_documented_schema_version_is_the_code_s(doc):
    current = re.findall(r"^Current `data\.schema_version`: \*\*(\d+)\*\*", doc, re.M)
    assert current == [str(SCHEMA_VERSION)]
    title = re.findall(r"^# .*\(payload schema version (\d+)\)", doc, re.M)
    assert title in ([], [str(SCHEMA_VERSION)])


# ---------------------------------------------------------------- examples


def test_every_json_example_in_the_doc_parses(doc):
    blocks = json_blocks(doc)
    assert len(blocks) >= len(EVENT_TYPES)
    for block in blocks:
        try:
            json.loads(block)
        except ValueError as exc:
            pytest.fail(f"a JSON example does not parse ({exc}):\n{block[:400]}")


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
def test_each_section_has_one_complete_example_of_its_own_type(doc, event_type):
    section = event_sections(doc).get(event_type)
    assert section is not None, f"no section for {event_type}"
    blocks = json_blocks(section)
    assert len(blocks) == 1, f"{event_type}: {len(blocks)} JSON examples, want exactly one"
    example = json.loads(blocks[0])
    assert example["type"] == event_type
    assert set(example) == {"type", "timestamp", "data"}
    real = sample_event(event_type).payload()
    assert list(example["data"]) == list(real["data"]), f"{event_type}: the example's fields differ from payload()"
    assert example["data"]["schema_version"] == SCHEMA_VERSION
    assert example["data"]["severity"] == EVENT_TYPES[event_type].value


def test_json_examples_outside_event_sections_name_only_real_types(doc):
    plain = doc
    for body in event_sections(doc).values():
        plain = plain.replace(body, "")
    for block in json_blocks(plain):
        value = json.loads(block)
        if isinstance(value, dict) and isinstance(value.get("type"), str) and "data" in value:
            assert value["type"] in EVENT_TYPES


# ------------------------------------------------- signatures and subscriptions


def test_the_signature_snippet_verifies_a_body_signed_by_the_notifier(doc, monkeypatch):
    pytest.importorskip("standardwebhooks")
    snippets = [m.group(2) for m in FENCE.finditer(sections(doc, 2)["Verifying signatures"]) if m.group(1) == "python"]
    assert len(snippets) == 1
    secret = "whsec_" + base64.b64encode(b"docs-snippet-test-key-0123456789").decode()
    monkeypatch.setenv("TW_WEBHOOK_SECRET", secret)
    namespace: dict = {}
    exec(compile(snippets[0], "docs/EVENTS.md", "exec"), namespace)  # noqa: S102 - our own doc
    event = sample_event("job.failed")
    body = json.dumps(event.payload()).encode()
    stamp = int(time.time())
    headers = {"webhook-id": event.id, "webhook-timestamp": str(stamp),
               "webhook-signature": sign(secret, event.id, stamp, body)}
    assert namespace["handle"](body, headers) == 200
    assert namespace["handle"](body + b" ", headers) == 401


def _config_keys() -> set[str]:
    """Every key config.py reads from a subscription file: ``x.get("key", ...)``,
    and ``_globs(fields, "key")`` for the glob lists."""
    keys = set()
    for node in ast.walk(ast.parse(CONFIG_PATH.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            arg = node.args[0] if node.args else None
        elif isinstance(node.func, ast.Name) and node.func.id == "_globs":
            arg = node.args[1] if len(node.args) > 1 else None
        else:
            continue
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            keys.add(arg.value)
    return keys


def test_the_subscription_reference_lists_exactly_the_keys_config_reads(doc):
    chapter = sections(doc, 2).get("Subscription files")
    assert chapter is not None, "docs/EVENTS.md has no '## Subscription files' section"
    keys = _config_keys()
    assert {"name", "url", "interval_s", "max_attempts"} <= keys, "config.py is no longer read as expected"
    rows = table_names(chapter, first_header="key")
    table = {name.rsplit(".", 1)[-1] for name in rows}
    # The two top-level keys are shown in the example file rather than the table.
    top = {"version", "subscriptions"}
    parents = {name.split(".", 1)[0] for name in rows if "." in name}
    assert sorted(keys - table - top - parents) == [], "keys config.py reads but the reference lacks"
    assert sorted(table - keys) == [], "keys the reference lists but config.py does not read"
    for key in top:
        assert re.search(rf"^{key}:", chapter, re.M), f"the example file does not show '{key}'"
