"""Loading subscriptions: shipped examples, filters, templates and their errors."""

import json
import textwrap

import msgspec
import pytest

from trainwarden.notify import load_subscriptions, missing_env, sample_event, shipped_notifications_dir
from trainwarden.notify.events import EVENT_TYPES, events_from_decision
from trainwarden.yamlsrc import ConfigError
from tests.notify.test_events import CASES


def write(directory, text, name="subs.yaml"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(textwrap.dedent(text))
    return directory


def test_the_shipped_examples_are_valid_switched_off_and_use_the_three_builtin_templates():
    subs = load_subscriptions()
    assert [s.name for s in subs] == ["ops-webhook", "ml-oncall-slack", "team-dingtalk"]
    assert not any(s.enabled for s in subs)
    assert {s.template.what for s in subs} == {"template 'json'", "template 'slack'", "template 'dingtalk'"}
    assert (shipped_notifications_dir() / "templates" / "slack.j2").is_file()


@pytest.mark.parametrize("template", ["json", "slack", "dingtalk"])
def test_each_builtin_template_renders_valid_json_for_every_event_type(template, tmp_path):
    sub = load_subscriptions(write(tmp_path, f"""\
        version: 1
        subscriptions:
          - name: t
            target: {{url: "https://example.com/hook"}}
            template: {template}
        """)).get("t")
    for event_type in EVENT_TYPES:
        event = sample_event(event_type)
        body = json.loads(sub.template.render(event.payload(2, event.time - 5), "t"))
        text = json.dumps(body, ensure_ascii=False)
        assert event.summary.split(":")[0] in text
        if template == "json":
            assert body == json.loads(json.dumps(event.payload(2, event.time - 5)))


def test_a_job_error_with_quotes_and_newlines_stays_valid_json_in_every_template(tmp_path):
    nasty = msgspec.structs.replace(CASES[0][0], error_message='bad "quote"\n</script>\t\\ 中文 {{ x }}')
    [event] = events_from_decision(nasty)
    for sub in load_subscriptions():
        json.loads(sub.template.render(event.payload(), sub.name))


def test_filters_select_by_type_glob_job_glob_and_severity(tmp_path):
    subs = load_subscriptions(write(tmp_path, """\
        version: 1
        subscriptions:
          - name: prod-failures
            events: ["job.*", "hang.detected"]
            jobs: ["prod-*"]
            min_severity: error
            target: {url: "https://example.com/hook"}
        """))
    sub = subs.get("prod-failures")
    assert sub.event_types() == ["job.failed", "hang.detected"]
    failed = sample_event("job.failed", job_id="prod-7")
    assert sub.matches(failed)
    assert not sub.matches(sample_event("job.failed", job_id="dev-7"))
    assert not sub.matches(sample_event("job.restarted", job_id="prod-7"))  # a warning
    assert not sub.matches(sample_event("node.lost", job_id="prod-7"))  # not subscribed


def test_a_broken_template_file_is_reported_with_its_own_file_and_line(tmp_path):
    directory = write(tmp_path / "subs", """\
        version: 1
        subscriptions:
          - name: t
            target: {url: "https://example.com/hook"}
            template: mine
        """)
    (directory / "templates").mkdir()
    broken = directory / "templates" / "mine.j2"
    broken.write_text('{\n  "text": {{ data.summary | tojson }},\n  {% if data.node %}\n  "node": 1\n}\n')
    with pytest.raises(ConfigError) as caught:
        load_subscriptions(directory)
    assert str(caught.value).startswith(f"{broken}:")
    assert "template syntax error" in str(caught.value) and "endif" in str(caught.value)


def test_a_template_file_failing_on_one_event_type_names_the_line_and_the_type(tmp_path):
    directory = write(tmp_path / "subs", """\
        version: 1
        subscriptions:
          - name: t
            target: {url: "https://example.com/hook"}
            template: mine
        """)
    (directory / "templates").mkdir()
    mine = directory / "templates" / "mine.j2"
    mine.write_text('{"text": {{ data.summary | tojson }},\n'
                    ' "verdict": {{ data.details.stack_report.verdict | tojson }}}\n')
    with pytest.raises(ConfigError) as caught:
        load_subscriptions(directory)
    message = str(caught.value)
    assert message.startswith(f"{mine}:2:") and "stack_report" in message and "sample" in message


def test_a_directory_template_overrides_a_builtin_of_the_same_name(tmp_path):
    directory = write(tmp_path / "subs", """\
        version: 1
        subscriptions:
          - name: t
            target: {url: "https://example.com/hook"}
            template: slack
        """)
    (directory / "templates").mkdir()
    (directory / "templates" / "slack.j2").write_text('{"mine": {{ type | tojson }}}')
    sub = load_subscriptions(directory).get("t")
    assert json.loads(sub.template.render(sample_event("job.failed").payload(), "t")) == {"mine": "job.failed"}


def test_environment_references_are_listed_and_resolved_only_in_memory(tmp_path):
    subs = load_subscriptions(write(tmp_path, """\
        version: 1
        subscriptions:
          - name: t
            target:
              url: ${HOOK_URL}
              headers: {Authorization: "Bearer ${HOOK_TOKEN}", X-Team: ml}
            secret: ${HOOK_SECRET}
        """))
    sub = subs.get("t")
    assert sub.env_vars() == ["HOOK_SECRET", "HOOK_TOKEN", "HOOK_URL"]
    assert [name for _, name in missing_env(subs, {"HOOK_URL": "https://x.example"})] == ["HOOK_SECRET", "HOOK_TOKEN"]
    resolved = sub.resolved({"HOOK_URL": "https://x.example/h", "HOOK_TOKEN": "tok", "HOOK_SECRET": "whsec_AAAA"})
    assert dict(resolved.headers)["Authorization"] == "Bearer tok" and "tok" not in repr(resolved)
    with pytest.raises(ValueError, match="must start with 'whsec_'"):
        sub.resolved({"HOOK_URL": "https://x.example/h", "HOOK_TOKEN": "tok", "HOOK_SECRET": "plain"})
    with pytest.raises(ValueError, match="line break"):
        sub.resolved({"HOOK_URL": "https://x", "HOOK_TOKEN": "tok\r\nX-Evil: 1", "HOOK_SECRET": "whsec_AAAA"})


def test_an_empty_directory_and_a_missing_one_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="no subscription files"):
        load_subscriptions(tmp_path)
    with pytest.raises(ConfigError, match="not a directory"):
        load_subscriptions(tmp_path / "nope")


def test_loopback_targets_pass_only_with_an_explicit_permission(tmp_path):
    text = """\
        version: 1
        subscriptions:
          - name: t
            target: {url: "http://127.0.0.1:9000/hook"ALLOW}
        """
    with pytest.raises(ConfigError, match="loopback"):
        load_subscriptions(write(tmp_path / "a", text.replace("ALLOW", "")))
    assert load_subscriptions(write(tmp_path / "b", text.replace("ALLOW", "")), allow_loopback=True)
    assert load_subscriptions(write(tmp_path / "c", text.replace("ALLOW", ", allow_private_targets: true")))


GLOO = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
        "[127.0.0.1]:40123 <!channel> ``` *bold* & more")
NCCL = "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout"


def test_real_gloo_and_nccl_texts_reach_every_chat_template_as_text_not_markup(tmp_path):
    for message in (GLOO, NCCL):
        decision = msgspec.structs.replace(CASES[0][0], error_message=message)
        [event] = events_from_decision(decision)
        bodies = {sub.template.what: json.loads(sub.template.render(event.payload(), sub.name))
                  for sub in load_subscriptions()}
        assert message in json.dumps(bodies["template 'json'"], ensure_ascii=False)
        slack = json.dumps(bodies["template 'slack'"], ensure_ascii=False)
        # Slack shows &amp; &lt; &gt; as & < >; a link, a mention or a closing ``` cannot be made.
        shown = message.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("```", "`\u200b``")
        assert shown in slack and "<!channel>" not in slack
        dingtalk = bodies["template 'dingtalk'"]["markdown"]["text"]
        assert "\\[/pytorch/third\\_party/gloo/gloo/transport/tcp/pair.cc:561\\]" in dingtalk or "\\[rank3\\]" in dingtalk
