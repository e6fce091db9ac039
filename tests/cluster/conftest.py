"""Fixtures every test on the real broker shares."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def bootstrap() -> str:
    """The broker the Kafka tests run against; they skip, saying how to start one, without it."""
    value = os.environ.get("TRAINWARDEN_KAFKA")
    if not value:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    return value
