"""Not found is a non-zero exit, a filter matching nothing says so, and a read never creates a store."""

import json

import pytest

from trainwarden.store import open_writer

from tests.test_cli import _record


@pytest.mark.parametrize("command", [("history",), ("history", "--jobs"), ("stacks", "--job", "j1"),
                                     ("notify", "log"), ("store", "optimize"),
                                     ("report", "--job", "j1", "-o", "-")])
def test_a_read_of_a_store_that_does_not_exist_fails_and_creates_nothing(cli, tmp_path, command):
    missing = tmp_path / "no" / "such" / "dir"
    result = cli(*command, "--store", str(missing))
    assert result.code == 2, result
    assert f"The history store {missing} does not exist." in result.err and "Traceback" not in result.err
    assert not (tmp_path / "no").exists()


def test_an_empty_directory_is_not_taken_for_a_store(cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("history", "--store", str(empty))
    assert result.code == 2 and "holds no history store" in result.err, result
    assert list(empty.iterdir()) == []


def test_an_unknown_job_is_exit_2_like_the_report(cli, store):
    open_writer(store).write([_record("j1", "a", 1_800_000_000.0, "worker-0", "NCCL error 1")])
    for command in (("history",), ("history", "--aggregate"), ("history", "--jobs"), ("history", "--json"),
                    ("stacks",), ("notify", "log")):
        result = cli(*command, "--job", "nosuch")
        assert result.code == 2, (command, result)
        assert "has no job 'nosuch'" in result.err and result.out == "", (command, result)
    assert json.loads(cli("history", "--job", "j1", "--json").out)[0]["job_id"] == "j1"


def test_a_filter_matching_nothing_is_told_apart_from_an_empty_history(cli, store):
    from tests.store.store_factories import job

    open_writer(store).write([job("j0", 1_799_999_990.0)])
    empty = cli("history")
    assert empty.code == 0 and "Fault records: nothing recorded yet." in empty.out, empty
    open_writer(store).write([_record("j1", "a", 1_800_000_000.0, "worker-0", "NCCL error 1")])
    for filters in (("--node", "nosuch"), ("--source", "hang"), ("--aggregate", "--node", "nosuch")):
        result = cli("history", *filters)
        assert result.code == 0, result
        assert "nothing recorded yet" not in result.out
        assert f"no fault record matches {filters[-2]} {filters[-1]}" in result.out, result
