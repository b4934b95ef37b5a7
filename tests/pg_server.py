"""A private PostgreSQL server for tests that need settings the shared one must not
have (TLS; logins that check a password, where the shared one trusts 127.0.0.1):
``initdb`` into a temporary directory as the ``postgres`` OS user, on a free port,
listening on 127.0.0.1 and its own socket directory only, stopped and deleted
afterwards."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.nats_server import free_port


def postgres_bin_dir() -> Path | None:
    """The newest installed PostgreSQL's binaries (Debian's layout), if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda path: int(Path(path).parts[-3]) if
                   Path(path).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def why_not_available() -> str | None:
    """Why a private server cannot be started here, or None."""
    if postgres_bin_dir() is None:
        return "PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "there is no postgres OS user to run initdb as"
    if os.geteuid() != 0:
        return "starting a server as the postgres user needs root (runuser)"
    if shutil.which("runuser") is None:
        return "runuser is not installed"
    return None


class PrivatePostgres:
    """A PostgreSQL server of the test's own. ``conf`` lines are appended to its
    postgresql.conf and ``hba`` lines make its whole pg_hba.conf; ``files`` are copied
    into its data directory, owned by postgres and readable by it alone (a server
    key must be), under the names given. ``superuser_password``: the password of its
    superuser ``postgres`` (for an ``hba`` that checks passwords)."""

    def __init__(self, conf: Sequence[str], hba: Sequence[str],
                 files: dict[str, Path] | None = None, *,
                 superuser_password: str | None = None) -> None:
        bin_dir = postgres_bin_dir()
        assert bin_dir is not None, why_not_available()
        self.bin_dir = bin_dir
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="meshpoint-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.conf = list(conf)
        self.hba = list(hba)
        self.files = dict(files or {})
        self.superuser_password = superuser_password
        self.started = False

    def url(self, user: str = "postgres", password: str | None = None) -> str:
        """A store URL for ``user`` (the superuser, with its password, by default)."""
        secret = self.superuser_password if password is None else password
        login = user if secret is None else f"{user}:{secret}"
        return f"postgresql+asyncpg://{login}@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str) -> None:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *args],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr}\n{log}")

    def start(self) -> None:
        user = pwd.getpwnam("postgres")
        os.chown(self.base, user.pw_uid, user.pw_gid)
        password = []
        if self.superuser_password is not None:
            pwfile = self.base / "pw"
            pwfile.write_text(self.superuser_password)
            os.chown(pwfile, user.pw_uid, user.pw_gid)
            password = [f"--pwfile={pwfile}"]
        self._as_postgres(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U",
                          "postgres", "--auth=trust", *password, "--no-sync", "-E", "UTF8")
        for name, source in self.files.items():
            target = self.data / name
            shutil.copyfile(source, target)
            os.chown(target, user.pw_uid, user.pw_gid)
            target.chmod(0o600)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n".join([
                f"port = {self.port}", "listen_addresses = '127.0.0.1'",
                f"unix_socket_directories = '{self.base}'", "fsync = off",
                "max_connections = 30", "shared_buffers = 16MB", *self.conf]) + "\n")
        (self.data / "pg_hba.conf").write_text("\n".join(self.hba) + "\n")
        self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l",
                          str(self.log), "-w", "-t", "60", "start")
        self.started = True

    def down(self, mode: str = "immediate") -> None:
        """Stop the server (``pg_ctl stop -m mode``: ``immediate`` ends every session
        at once, as a crash would), keeping its data, to bring it :meth:`up` again."""
        self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode,
                          "-w", "stop")
        self.started = False

    def up(self) -> None:
        """Start the server again after :meth:`down`, on the same port."""
        self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l",
                          str(self.log), "-w", "-t", "60", "start")
        self.started = True

    def stop(self) -> None:
        try:
            if self.started:
                self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.data),
                                  "-m", "immediate", "-w", "stop")
                self.started = False
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
