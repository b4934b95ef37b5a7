"""Fixtures of the acceptance tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests.conftest import forget_namespace


@pytest.fixture
async def namespace(nats_url: str) -> AsyncIterator[str]:
    """A NATS namespace of the test's own, its stream deleted afterwards."""
    name = f"ns{uuid.uuid4().hex[:10]}"
    yield name
    await forget_namespace(nats_url, name)
