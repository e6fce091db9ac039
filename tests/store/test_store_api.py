"""How callers reach a store: directories, URLs, the default place, the errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainwarden.store import (HistoryReader, HistoryWriter, SpoolWriter, StoreError, default_store_dir, open_reader,
                            open_writer, register_scheme)
from trainwarden.store.queries import param_text, quote_identifier
from trainwarden.store.server import PASSWORD_ENV, ServerStore, parse_url
from tests.store.store_factories import fault

REPO = Path(__file__).resolve().parents[2]


def test_a_directory_opens_the_embedded_store_and_its_spool(store_dir):
    from trainwarden.store.embedded import EmbeddedStore

    writer, reader = open_writer(store_dir), open_reader(str(store_dir), wait_s=5)
    assert isinstance(writer, SpoolWriter) and isinstance(writer, HistoryWriter)
    assert isinstance(reader, EmbeddedStore) and isinstance(reader, HistoryReader)
    assert reader.lock_timeout_s == 5
    writer.write([fault()])
    with open_reader(f"file://{store_dir}") as same:
        assert len(same.faults()) == 1


def test_a_server_url_opens_a_server_store_without_connecting_yet():
    store = open_reader("https://alice@clickhouse.example:9443/history")
    assert isinstance(store, ServerStore) and isinstance(store, HistoryReader)
    assert isinstance(open_writer("http://clickhouse.example"), ServerStore)
    assert parse_url("https://alice@clickhouse.example:9443/history") == {
        "host": "clickhouse.example", "port": 9443, "secure": True, "username": "alice", "database": "history"}
    assert parse_url("http://h") == {"host": "h", "port": 8123, "secure": False, "username": None,
                                     "database": "trainwarden"}


@pytest.mark.parametrize("url, message", [
    ("https://alice:secret@h/db", "contains a password"),
    ("https://h/not-an-identifier", "not valid"),
    ("http://h:notaport/", "not valid"),
])
def test_a_bad_server_url_is_a_store_error_with_a_hint(url, message):
    with pytest.raises(StoreError, match=message) as caught:
        open_reader(url)
    assert caught.value.hint
    if "password" in message:
        assert PASSWORD_ENV in caught.value.hint and "secret" not in str(caught.value)


def test_an_unknown_scheme_names_the_known_ones():
    with pytest.raises(StoreError, match=r"unknown scheme kafka://") as caught:
        open_reader("kafka://broker/topic")
    assert "http://" in caught.value.hint and "https://" in caught.value.hint


def test_a_registered_scheme_opens_with_its_factories(monkeypatch):
    import trainwarden.store as store

    monkeypatch.setattr(store, "_SCHEMES", dict(store._SCHEMES))
    opened = []
    register_scheme("memo", lambda target, wait: opened.append(("r", target, wait)) or "reader",
                    lambda target, wait: opened.append(("w", target)) or "writer")
    assert (open_reader("memo://x", wait_s=1.5), open_writer("MEMO://y")) == ("reader", "writer")
    assert opened == [("r", "memo://x", 1.5), ("w", "MEMO://y")]


def test_the_default_store_is_trainwarden_store_then_xdg_state_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAINWARDEN_STORE", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert default_store_dir() == tmp_path / "home" / ".local" / "state" / "trainwarden" / "store"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/is/ignored")
    assert default_store_dir() == tmp_path / "home" / ".local" / "state" / "trainwarden" / "store"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_store_dir() == tmp_path / "state" / "trainwarden" / "store"
    monkeypatch.setenv("TRAINWARDEN_STORE", str(tmp_path / "explicit"))
    assert default_store_dir() == tmp_path / "explicit"
    assert isinstance(open_writer(None), SpoolWriter) and open_writer(None).directory == tmp_path / "explicit"


def test_a_store_error_carries_its_sentence_and_hint():
    error = StoreError("The history store /x is busy.", hint="wait")
    assert (str(error), error.message, error.hint) == ("The history store /x is busy.", "The history store /x is busy.",
                                                       "wait")


def test_writing_loads_neither_chdb_nor_clickhouse_connect(store_dir):
    script = ("import sys; from trainwarden.store import open_writer; from trainwarden.store.records import DeadLetter;"
              f"open_writer({str(store_dir)!r}).write([DeadLetter(1.0, 's', 'j', 'e', 'p')]);"
              "print('chdb' in sys.modules, 'clickhouse_connect' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(REPO / "pipeline"))
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("value, text", [
    (None, "\\N"), ("plain", "plain"), ("a\\b", "a\\\\b"), ("t\tn\nr\r", "t\\tn\\nr\\r"), ("it's", "it\\'s"),
    ("\\N", "\\\\N"), ("nul\0", "nul\\0"), (7, "7"), (2**64 - 1, "18446744073709551615"), (True, "1"),
])
def test_query_parameters_are_sent_in_clickhouse_escaped_text(value, text):
    assert param_text(value) == text


def test_only_plain_identifiers_are_accepted_as_database_names():
    assert quote_identifier("trainwarden_2") == "`trainwarden_2`"
    for bad in ("", "a-b", "a`b", "1abc", "db; DROP"):
        with pytest.raises(ValueError):
            quote_identifier(bad)


def test_a_server_store_on_a_borrowed_client_cannot_be_used_after_close():
    class Client:
        closed = False

        def close(self):
            self.closed = True

    client = Client()
    store = ServerStore("borrowed", client=client)
    store.close()
    assert client.closed
    with pytest.raises(StoreError, match="is closed"):
        store.faults()
