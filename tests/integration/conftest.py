"""Fixtures of the integration tests that need more than a store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from meshpoint.store import SqlStore
from tests.integration.mesh import Mesh


@pytest.fixture
async def mesh(live_store: SqlStore) -> AsyncIterator[Mesh]:
    """A started :class:`Mesh` on an empty store of the parametrised backend."""
    started = await Mesh(live_store).start()
    try:
        yield started
    finally:
        await started.close()
