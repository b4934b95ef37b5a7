"""``meshpoint llm serve`` as a real process, on a stand-in ``llama-server`` (a small
HTTP server in its place in the cache) so that its wiring is proven without the
build: what it starts, the URL it prints, that SIGINT and SIGTERM stop the server,
that a server which dies is reported, and that with nothing built it says how to
build instead of building. The real server: ``tests/acceptance/test_llm_server.py::
test_meshpoint_llm_serve_serves_the_real_model``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from meshpoint.llm import local_server

pytestmark = pytest.mark.timeout(120)

#: A stand-in for llama-server: records its command line, serves /health and
#: /v1/models, exits 0 on SIGTERM (writing "stopped") and 7 on GET /quit.
FAKE = textwrap.dedent("""\
    #!{python}
    import json, signal, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from pathlib import Path
    here = Path(__file__).parent
    (here / "argv.json").write_text(json.dumps(sys.argv[1:]))
    port = int(sys.argv[sys.argv.index("--port") + 1])
    host = sys.argv[sys.argv.index("--host") + 1]
    def stopped(*_):
        (here / "stopped").write_text("SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopped)
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass
        def do_GET(self):
            if self.path == "/quit":
                sys.stderr.write("fatal: out of memory\\n")
                sys.stderr.flush()
                import os
                os._exit(7)
            body = json.dumps({{"status": "ok", "path": self.path}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    HTTPServer((host, port), Handler).serve_forever()
    """)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MESHPOINT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def built(cache: Path) -> Path:
    """The stand-in, where this machine's build would be, and the bundled model's
    file; the stand-in's directory (where it records what it was given)."""
    binary = local_server.server_dir() / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text(FAKE.format(python=sys.executable))
    binary.chmod(0o755)
    local_server.model_path().parent.mkdir(parents=True)
    local_server.model_path().write_bytes(b"GGUF")
    return binary.parent


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "meshpoint.cli", "llm", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_serve_prints_the_url_and_stops_the_server_on_a_signal(
        cache: Path, signum: int) -> None:
    home = built(cache)
    process = start("--port", "0", "--json", "--no-build")
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        assert ready["model"] == local_server.MODEL_NAME
        assert ready["base_url"] == f"http://127.0.0.1:{ready['port']}/v1"
        assert get(ready["base_url"] + "/models")["path"] == "/v1/models"
        argv = json.loads((home / "argv.json").read_text())
        assert argv[argv.index("-m") + 1] == str(local_server.model_path())
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--alias") + 1] == local_server.MODEL_NAME
        assert not (home / "stopped").exists()
        process.send_signal(signum)
        assert process.wait(30) == 0, process.stderr.read()  # type: ignore[union-attr]
    finally:
        process.kill()
        process.communicate()
    assert (home / "stopped").read_text() == "SIGTERM", "the server was left running"


def test_serve_runs_a_model_of_one_s_own_and_prints_the_url_alone(
        cache: Path, tmp_path: Path) -> None:
    home = built(cache)
    mine = tmp_path / "Mine-1B.Q4.gguf"
    mine.write_bytes(b"GGUF")
    process = start("--port", "0", "--model", str(mine), "--no-build")
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        argv = json.loads((home / "argv.json").read_text())
        assert (argv[argv.index("-m") + 1], argv[argv.index("--alias") + 1]) == (
            str(mine), "Mine-1B.Q4")
        process.send_signal(signal.SIGINT)
        _, said = process.communicate(timeout=90)  # the stand-in stopped: 15 s at most
    finally:
        process.kill()
        process.communicate()  # reaped, its pipes closed (the next test's warnings)
    assert process.returncode == 0
    told = " ".join(said.split())
    assert f"model: {{kind: openai, name: Mine-1B.Q4, base_url: {url}, tool_mode: json}}" \
        in told, said


def test_a_server_that_dies_is_reported_with_its_log(cache: Path) -> None:
    built(cache)
    process = start("--port", "0", "--json", "--no-build")
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        with pytest.raises(OSError):
            get(ready["base_url"].removesuffix("/v1") + "/quit")
        out, _ = process.communicate(timeout=90)
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == 1
    problem = json.loads(out)
    assert "llama-server exited with 7" in problem["error"]
    assert "fatal: out of memory" in problem["error"]


def test_with_nothing_built_it_says_how_to_build_and_builds_nothing(cache: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "meshpoint.cli", "llm", "serve",
                           "--no-build"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    said = " ".join(done.stderr.split())
    assert "the llama-server binary and the model are not under" in said
    assert "meshpoint llm build" in said and "make llm" in said
    assert not cache.exists() or not any(cache.iterdir()), "it fetched or built something"


def test_build_prints_where_the_server_and_the_model_are_and_builds_nothing_twice(
        cache: Path) -> None:
    home = built(cache)
    done = subprocess.run([sys.executable, "-m", "meshpoint.cli", "llm", "build", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    paths = json.loads(done.stdout)
    assert (paths["server"], paths["model"], paths["cached"]) == (
        str(home / "llama-server"), str(local_server.model_path()), True)
