"""A private PostgreSQL server for tests that need settings the shared one must keep
(its 127.0.0.1 logins are trusted, without a password): initdb into a temporary
directory as the ``postgres`` OS user, started on a free port, removed after."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.nats_server import free_port


def pg_bin_dir() -> Path | None:
    """The directory of PostgreSQL's server programs (initdb, pg_ctl), if installed."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return versions[-1].parent if versions else None


class PrivatePostgres:
    """A PostgreSQL cluster whose every login, on TCP and on its socket, checks a
    SCRAM-SHA-256 password (``auth``); its superuser ``postgres`` has
    ``superuser_password``."""

    def __init__(self, bin_dir: Path, *, auth: str = "scram-sha-256",
                 superuser_password: str = "owner-pw") -> None:
        self.bin_dir = bin_dir
        self.auth = auth
        self.superuser_password = superuser_password
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="mp_pg_"))
        self.data = self.root / "data"

    def url(self, user: str = "postgres", password: str | None = None) -> str:
        secret = self.superuser_password if password is None else password
        return f"postgresql+asyncpg://{user}:{secret}@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str) -> None:
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *args]
        else:
            command = list(args)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        pwfile = self.root / "pw"
        pwfile.write_text(self.superuser_password)
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        self._as_postgres(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U",
                          "postgres", f"--pwfile={pwfile}", f"--auth={self.auth}",
                          "--no-sync", "-E", "UTF8")
        self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w",
                          "-t", "60", "-l", str(self.root / "log"), "-o",
                          f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                          "-c fsync=off", "start")  # -w: returns once it accepts logins

    def stop(self) -> None:
        if self.data.exists():
            self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m",
                              "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
