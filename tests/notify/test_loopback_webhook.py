"""An operator who wants webhooks on this host (a receiver on 127.0.0.1)
follows the refusal's hint and gets them: the hint says where
`allow_private_targets: true` goes, the key put on the subscription instead
(as the README used to say) is an error naming that place rather than the
same refusal again, and with it under `target:` a real HTTP server on
127.0.0.1 receives the webhook from a real `trainwarden notify test`, which
has no test-only loopback permission. Metadata stays refused whatever is set."""

from __future__ import annotations

import json

from tests.notify.conftest import ENV, receiver  # noqa: F401 - fixture

HINT = "add 'allow_private_targets: true' to the subscription's 'target:' (beside its 'url')"


def _write(directory, subscription: str) -> str:
    directory.mkdir(exist_ok=True)
    (directory / "local.yaml").write_text("version: 1\nsubscriptions:\n" + subscription)
    return str(directory)


def test_a_receiver_on_loopback_gets_the_webhook_once_the_target_allows_it_as_the_hint_says(
        cli, tmp_path, receiver):  # noqa: F811 - fixture
    hook = receiver()
    assert hook.url.startswith("http://127.0.0.1:")
    directory = tmp_path / "notifications"

    refused = cli("notify", "validate", _write(directory, f"  - name: local\n    target: {{url: '{hook.url}'}}\n"))
    assert refused.code == 2 and "target refused: 127.0.0.1 is the loopback interface" in refused.err, refused
    assert HINT in " ".join(refused.err.split()), refused

    misplaced = cli("notify", "validate", _write(directory, f"  - name: local\n    allow_private_targets: true\n"
                                                            f"    target: {{url: '{hook.url}'}}\n"))
    assert misplaced.code == 2, misplaced
    assert "local.yaml:4: 'allow_private_targets' belongs to the subscription's 'target:'" in misplaced.err, misplaced

    _write(directory, f"  - name: local\n    target: {{url: '{hook.url}', allow_private_targets: true}}\n"
                      "    secret: ${TW_SECRET}\n")
    sent = cli("notify", "test", "local", "--dir", str(directory), "--type", "job.failed", "--json", env=ENV)
    assert sent.code == 0, sent
    assert json.loads(sent.out)["outcome"] == "delivered"
    [request] = hook.requests
    assert request.path == "/hook" and request.webhook_id.startswith("evt_")
    assert json.loads(request.body)["type"] == "job.failed"
    assert request.headers["webhook-signature"].startswith("v1,")


def test_metadata_and_link_local_targets_stay_refused_with_allow_private_targets(cli, tmp_path):
    for url in ("http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/x",
                "http://169.254.10.1:8080/hook", "http://[::ffff:169.254.169.254]/"):
        directory = tmp_path / f"d{abs(hash(url))}"
        result = cli("notify", "validate", _write(directory, f"  - name: meta\n    target: {{url: '{url}', "
                                                             "allow_private_targets: true}\n"))
        assert result.code == 2 and "target refused" in result.err, (url, result)
        assert "no setting allows it" in result.err, (url, result)
