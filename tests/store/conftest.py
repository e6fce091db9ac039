"""The backends the behaviour tests run against."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from trainwarden.store import SpoolWriter


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
    from trainwarden.store.embedded import EmbeddedStore

    directory = tmp_path / "store"
    return Backend("embedded", SpoolWriter(directory), lambda: EmbeddedStore(directory))


def _connect_chdb(tmp_path) -> Backend:
    # ServerStore's code (clickhouse-connect calls, parameter binding, the shared
    # SQL) against clickhouse-connect's in-process chDB interface: no server needed.
    import clickhouse_connect

    from trainwarden.store.server import ServerStore

    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "connect-chdb"))
    store = ServerStore("chdb (clickhouse-connect)", client=client, database="trainwarden_test")
    return Backend("server-code-on-chdb", store, lambda: _Borrowed(store), store.close)


def _server(tmp_path, url: str) -> Backend:
    import clickhouse_connect

    from trainwarden.store.server import PASSWORD_ENV, ServerStore, parse_url

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


def _docker_unavailable() -> str:
    """Why testcontainers cannot start a container here ("" when it can)."""
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return ""
    except Exception as exc:  # no socket, no permission, no daemon: all mean "no Docker"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


@pytest.fixture(scope="session")
def clickhouse_server_url():
    """A ClickHouse server for the ServerStore tests: $TRAINWARDEN_CLICKHOUSE_URL,
    else one started by testcontainers when a Docker engine answers."""
    url = os.environ.get("TRAINWARDEN_CLICKHOUSE_URL")
    if url:
        yield url
        return
    why = _docker_unavailable()
    if why:
        pytest.skip("no ClickHouse server: TRAINWARDEN_CLICKHOUSE_URL is not set and testcontainers finds no "
                    f"Docker engine ({why}); set TRAINWARDEN_CLICKHOUSE_URL (and TRAINWARDEN_CLICKHOUSE_PASSWORD) "
                    "to run the ServerStore tests against a server")
    from testcontainers.community.clickhouse import ClickHouseContainer

    from trainwarden.store.server import PASSWORD_ENV

    image = os.environ.get("TRAINWARDEN_CLICKHOUSE_IMAGE", "clickhouse/clickhouse-server:25.8")
    with ClickHouseContainer(image) as server:
        previous = os.environ.get(PASSWORD_ENV)
        os.environ[PASSWORD_ENV] = server.password
        try:
            yield f"http://{server.username}@{server.get_container_host_ip()}:{server.get_exposed_port(8123)}/default"
        finally:
            if previous is None:
                os.environ.pop(PASSWORD_ENV, None)
            else:
                os.environ[PASSWORD_ENV] = previous


@pytest.fixture(params=["embedded", "server-code-on-chdb", pytest.param("server", marks=pytest.mark.clickhouse)])
def backend(request, tmp_path):
    if request.param == "server":
        chosen = _server(tmp_path, request.getfixturevalue("clickhouse_server_url"))
    else:
        chosen = {"embedded": _embedded, "server-code-on-chdb": _connect_chdb}[request.param](tmp_path)
    yield chosen
    chosen.cleanup()
