"""``meshpoint.embedded``: a mesh config served whole in one process (SQLite and the
in-process broker), as a new user's first step; mistakes named before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshpoint import a2a
from meshpoint.embedded import embedded
from meshpoint.errors import ConfigurationError

CONFIG = """\
store: sqlite:///{db}
broker: memory://
agents:
  coordinator:
    peers: [{{agent: flights, timeout_s: 30}}, {{agent: hotels, timeout_s: 30}}]
  flights: {{}}
  hotels: {{}}
"""


async def test_every_agent_of_the_file_answers_in_this_process(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG.format(db=tmp_path / "mesh.db"))
    async with embedded(path) as client:
        task = await client.ask("coordinator", "Trip: flights, hotels", timeout_s=30)
    assert task.status.state is a2a.TaskState.COMPLETED
    assert "ask_flights(flights) = [flights] flights" in (
        task.status.message.parts[0].text if task.status.message else "")
    # The file's store kept what it ran: the SQLite file is there, migrated.
    assert (tmp_path / "mesh.db").exists()


async def test_a_mistake_is_named_before_anything_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG.format(db=tmp_path / "mesh.db"))
    with pytest.raises(ConfigurationError, match="no agent 'weather' in the config"):
        async with embedded(path, agents=["coordinator", "weather"]):
            pass
    path.write_text(f"store: sqlite:///{tmp_path / 'mesh.db'}\nbroker: memory://\n")
    with pytest.raises(ConfigurationError, match="defines no agents"):
        async with embedded(path):
            pass
    assert not (tmp_path / "mesh.db").exists()
