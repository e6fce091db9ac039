"""`-o table|wide|json|name` and `--no-headers` on the list commands; `--json` and `--wide` still work."""

import json

from trainwarden.store import open_writer

from tests.test_cli import _record


def _write(store):
    open_writer(store).write([_record("j1", "rec-a", 1_800_000_000.0, "worker-0", "NCCL error 1"),
                              _record("j2", "rec-b", 1_800_000_100.0, "worker-1", "NCCL error 2")])


def test_history_formats(cli, store):
    _write(store)
    assert json.loads(cli("history", "-o", "json").out) == json.loads(cli("history", "--json").out)
    assert cli("history", "-o", "name").out.split() == ["rec-a", "rec-b"]
    assert cli("history", "--aggregate", "-o", "name").out.split() == ["1:nccl_error"]  # once, as a group
    wide = cli("history", "-o", "wide").out
    assert "sync_retryable_failure" in wide and wide == cli("history", "--wide").out
    bare = cli("history", "--no-headers").out.splitlines()
    assert len(bare) == 2 and all(line.startswith("2027-01-15") for line in bare), bare
    headed = cli("history").out.splitlines()
    assert headed[0] == "Fault records" and headed[1].split()[:2] == ["time", "job"]


def test_other_list_commands_take_the_same_options(cli):
    assert cli("runtimes", "-o", "name").out.split() == ["local", "agents", "slurm", "kubernetes"]
    assert [r["name"] for r in json.loads(cli("runtimes", "-o", "json").out)] == ["local", "agents", "slurm", "kubernetes"]
    assert cli("runtimes", "--no-headers").out.splitlines()[0].split()[0] == "local"
    spot = ("simulate", "examples/spot-job.yaml", "--market", "examples/spot-market.yaml", "--bid", "0.3")
    assert cli(*spot, "-o", "name").out.splitlines() == ["as written", "discount 0.3"]
    assert [line.split()[0] for line in cli(*spot, "--no-headers").out.splitlines()] == ["as", "discount"]
    names = cli("notify", "validate", "-o", "name").out.split()
    assert names and names == [s["name"] for s in json.loads(cli("notify", "validate", "--json").out)["subscriptions"]]


def test_contradicting_formats_are_a_usage_error(cli, store):
    _write(store)
    result = cli("history", "--json", "-o", "name")
    assert result.code == 2 and "--json and -o name disagree" in result.err, result
    assert cli("history", "-o", "yaml").code == 2
