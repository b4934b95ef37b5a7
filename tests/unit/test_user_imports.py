"""The user's code a config names (``module:function``) is imported from the config
file's directory, or its ``python_path:``, without PYTHONPATH; when it does not load,
the error says which of three things went wrong and how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from meshpoint.config import load_config
from meshpoint.errors import ConfigurationError

SRC = Path(__file__).parents[2] / "src"


def mesh(tmp_path: Path, function: str, extra: str = "") -> Path:
    path = tmp_path / "mesh.yaml"
    path.write_text(textwrap.dedent(f"""\
        store: sqlite:///{tmp_path / 'mesh.db'}
        {extra}
        agents:
          helper:
            tools: [{{name: shout, function: '{function}'}}]
        """))
    return path


def build_elsewhere(config: Path) -> subprocess.CompletedProcess[str]:
    """``load_config(config).build_agent("helper")`` in a fresh interpreter, run in
    another directory, with only meshpoint's own source on PYTHONPATH."""
    code = ("from meshpoint.config import load_config\n"
            f"agent = load_config({str(config)!r}).build_agent('helper')\n"
            "print(agent.tools[0].fn({'query': 'hi'}))\n")
    elsewhere = config.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_tool_next_to_the_config_loads_without_pythonpath(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text("def shout(arguments):\n"
                                         "    return arguments['query'].upper()\n")
    done = build_elsewhere(mesh(tmp_path, "mytools:shout"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "HI"


def test_python_path_names_the_directories_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "lib" / "acme").mkdir(parents=True)
    (tmp_path / "lib" / "acme" / "__init__.py").write_text("")
    (tmp_path / "lib" / "acme" / "tools.py").write_text(
        "def shout(arguments):\n    return arguments['query'] + '!'\n")
    done = build_elsewhere(mesh(tmp_path, "acme.tools:shout", "python_path: [lib]"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hi!"
    # python_path replaces the default: the config's own directory is not searched.
    (tmp_path / "only_here.py").write_text("def shout(arguments):\n    return 1\n")
    done = build_elsewhere(mesh(tmp_path, "only_here:shout", "python_path: [lib]"))
    assert done.returncode != 0
    assert "module 'only_here' was not found" in done.stderr, done.stderr


@pytest.fixture
def name(monkeypatch: pytest.MonkeyPatch) -> str:
    """A module name no other test imports; sys.path restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    return f"user_tools_{uuid.uuid4().hex[:8]}"


def error_of(config: Path) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_config(config).build_agent("helper")
    return " ".join(str(caught.value).split())


def test_a_missing_module_names_where_it_was_looked_for_and_how_to_fix_it(
        tmp_path: Path, name: str) -> None:
    message = error_of(mesh(tmp_path, f"{name}:shout"))
    assert f"agents.helper.tools (shout): cannot import '{name}:shout': module {name!r} " \
           f"was not found. Searched the config's directories ({tmp_path.resolve()})" in message
    assert f"Put {name}.py" in message and "python_path:" in message \
        and "PYTHONPATH" in message
    (tmp_path / "lib").mkdir()
    (tmp_path / "more").mkdir()
    message = error_of(mesh(tmp_path, f"{name}.sub:shout", "python_path: [lib, more]"))
    assert f"module '{name}.sub' (its package {name!r}) was not found" in message
    assert f"({tmp_path.resolve() / 'lib'}, {tmp_path.resolve() / 'more'})" in message


def test_a_missing_function_names_what_the_module_defines(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("import os\n\ndef shout_it(arguments):\n"
                                         "    return 1\n\ndef _private():\n    pass\n")
    message = error_of(mesh(tmp_path, f"{name}:shout"))
    assert f"module {name!r} ({tmp_path.resolve() / f'{name}.py'}) has no attribute " \
           "'shout' (it defines: shout_it)" in message


@pytest.mark.parametrize(("body", "shown"), [
    ("import no_such_dependency_xyz\n", "ModuleNotFoundError: No module named "
                                        "'no_such_dependency_xyz'"),
    ("def shout(arguments):\n    return 1\nraise RuntimeError('no API key')\n",
     "RuntimeError: no API key"),
    ("def shout(arguments) return 1\n", "SyntaxError: ")],
    ids=["its-dependency-missing", "it-raises", "syntax"])
def test_an_error_inside_the_user_s_module_is_shown_with_where_it_happened(
        tmp_path: Path, name: str, body: str, shown: str) -> None:
    (tmp_path / f"{name}.py").write_text(body)
    message = error_of(mesh(tmp_path, f"{name}:shout"))
    assert f"cannot import '{name}:shout': importing module {name!r} raised {shown}" \
        in message
    assert f"(at {tmp_path.resolve() / f'{name}.py'}:" in message
    assert "fix it there" in message and "was not found" not in message


def test_a_python_path_entry_that_is_no_directory_is_named(tmp_path: Path, name: str) -> None:
    message = error_of(mesh(tmp_path, f"{name}:shout", "python_path: [tools]"))
    assert message == (f"python_path: 'tools' ({tmp_path.resolve() / 'tools'}) is not a "
                       "directory (its entries are relative to the config file)")
