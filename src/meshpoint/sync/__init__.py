"""Local-to-cloud sync (docs/sync.md): a SQLite deployment that works offline pushes
its history chains, event log, ended-task ledger and LangGraph threads to a PostgreSQL
store, each row applied exactly once, conflicts and unverifiable chains kept aside.

Modules:

* :mod:`~meshpoint.sync.tables` — the sync's tables (source ids, cursors, the conflict
  log; the LangGraph threads' change sequence and fingerprints), registered with the
  store (migrations 0015, 0016).
* :mod:`~meshpoint.sync.queries` — its named statements: reads of the source by rowid
  (commit order), the cloud's inserts, cursor and conflict log.
* :mod:`~meshpoint.sync.apply` — one batch applied inside a cloud transaction: rows
  inserted or compared, chains verified before they stay (new records after the
  cloud's head, or the whole chain read back under a savepoint).
* :mod:`~meshpoint.sync.threads` — the LangGraph saver's threads: a changed thread
  compared by fingerprint, applied row by row, last write wins by version when it was
  written on both sides.
* :mod:`~meshpoint.sync.push` — a pass: batches read in one source snapshot, each
  applied with its cursor in one cloud transaction; status (cursor and lag).
* :mod:`~meshpoint.sync.follow` — a pass as soon as the local file has new rows (and
  every interval), retried with backoff while the cloud is unreachable (``sync
  --follow``; ``serve`` with a ``sync:`` section).
* :mod:`~meshpoint.sync.move_tables` — the ledger of paused tasks moved to the cloud
  (migration 0017), registered with the store.
* :mod:`~meshpoint.sync.move_queries` — the move's named statements: a task's live
  rows read, held, released or given back (local), inserted (cloud).
* :mod:`~meshpoint.sync.move` — moving paused tasks to the cloud (``sync
  --move-paused``): hold, copy, release, one owner at every step.

It imports the store and the history's verification; the CLI (``meshpoint sync``,
:mod:`meshpoint.cli.sync`) imports it. This module imports nothing: the store loads
:mod:`~meshpoint.sync.tables` while it is itself being imported. Use
``from meshpoint.sync.push import Syncer`` and ``from meshpoint.sync.move import Mover``.
"""
