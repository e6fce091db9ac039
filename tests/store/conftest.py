"""The backends the behaviour tests run against."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from pipeline.store import SpoolWriter


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


class Backend:
    """A writer and a reader on one store, as a job run and `history` see it."""

    def __init__(self, name, writer, open_reader, cleanup=lambda: None):
        self.name = name
        self.writer = writer
        self.open_reader = open_reader
        self.cleanup = cleanup


def _embedded(tmp_path) -> Backend:
    from pipeline.store.embedded import EmbeddedStore

    directory = tmp_path / "store"
    return Backend("embedded", SpoolWriter(directory), lambda: EmbeddedStore(directory))


def _connect_chdb(tmp_path) -> Backend:
    # ServerStore's code (clickhouse-connect calls, parameter binding, the shared
    # SQL) against clickhouse-connect's in-process chDB interface: no server needed.
    import clickhouse_connect

    from pipeline.store.server import ServerStore

    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "connect-chdb"))
    store = ServerStore("chdb (clickhouse-connect)", client=client, database="trainwarden_test")
    return Backend("server-code-on-chdb", store, lambda: _Borrowed(store), store.close)


def _server(tmp_path) -> Backend:
    import clickhouse_connect

    from pipeline.store.server import PASSWORD_ENV, ServerStore, parse_url

    url = os.environ["TRAINWARDEN_CLICKHOUSE_URL"]
    parts = urlsplit(url)
    database = f"trainwarden_test_{uuid.uuid4().hex[:10]}"
    store = ServerStore(urlunsplit((parts.scheme, parts.netloc, "/" + database, "", "")))

    def drop():
        store.close()
        options = {k: v for k, v in parse_url(url).items() if k != "database"}
        with clickhouse_connect.get_client(**options, password=os.environ.get(PASSWORD_ENV, "")) as client:
            client.command(f"DROP DATABASE IF EXISTS `{database}`")

    return Backend("server", store, lambda: _Borrowed(store), drop)


class _Borrowed:
    """A `with` block on a shared ServerStore that does not close it."""

    def __init__(self, store):
        self.store = store

    def __enter__(self):
        return self.store

    def __exit__(self, *exc):
        return None


@pytest.fixture(params=["embedded", "server-code-on-chdb", pytest.param("server", marks=pytest.mark.clickhouse)])
def backend(request, tmp_path):
    if request.param == "server" and not os.environ.get("TRAINWARDEN_CLICKHOUSE_URL"):
        pytest.skip("no ClickHouse server: set TRAINWARDEN_CLICKHOUSE_URL (and TRAINWARDEN_CLICKHOUSE_PASSWORD) "
                    "to run the ServerStore tests against one")
    make = {"embedded": _embedded, "server-code-on-chdb": _connect_chdb, "server": _server}[request.param]
    chosen = make(tmp_path)
    yield chosen
    chosen.cleanup()
