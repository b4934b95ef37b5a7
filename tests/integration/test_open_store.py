"""Opening a store: URLs, drivers and unreachable databases give clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshpoint import TaskExecutionContext
from meshpoint.errors import ConfigurationError, InvalidArgumentError, StoreUnavailableError
from meshpoint.store import open_store


@pytest.mark.parametrize(("url", "match"), [
    ("mysql+aiomysql://root@localhost/test", "unsupported store URL scheme"),
    ("sqlite+pysqlcipher:///x.db", "unsupported store URL scheme"),
    ("not a url", "cannot parse store URL"),
])
async def test_unusable_urls_are_refused(url: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        await open_store(url)


async def test_schema_is_a_postgresql_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="PostgreSQL option"):
        await open_store(f"sqlite:///{tmp_path / 'x.db'}", schema="s")


async def test_a_tenant_id_is_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="tenant_id"):
        await open_store(f"sqlite:///{tmp_path / 'x.db'}", tenant_id="")


async def test_an_unreachable_postgresql_is_reported(unused_tcp_port: int) -> None:
    with pytest.raises(StoreUnavailableError, match=r"could not be reached|unavailable"):
        await open_store(f"postgresql://postgres@127.0.0.1:{unused_tcp_port}/test",
                         busy_timeout_s=2)


async def test_plain_sqlite_urls_and_memory_databases_work(tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path / 'nested' / 'dir' / 'x.db'}",
                "sqlite+aiosqlite:///:memory:", "sqlite://"):
        async with open_store(url) as store:
            ctx = TaskExecutionContext("t")
            ctx.current_invocation_id = "inv"
            ctx.register_peer_sub_task("s", {"peer_agent_name": "p"})
            await store.checkpoint_task(ctx, "agent")
            assert (await store.stats()).total_paused == 1
