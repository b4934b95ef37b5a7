"""Local-to-cloud sync (docs/sync.md): a SQLite deployment that works offline pushes
its history chains, event log and ended-task ledger to a PostgreSQL store, each row
applied exactly once, conflicts and unverifiable chains kept aside.

Modules:

* :mod:`~meshpoint.sync.tables` — the sync's tables (source ids, cursors, the conflict
  log), registered with the store (migration 0015).
* :mod:`~meshpoint.sync.queries` — its named statements: reads of the source by rowid
  (commit order), the cloud's inserts, cursor and conflict log.
* :mod:`~meshpoint.sync.apply` — one batch applied inside a cloud transaction: rows
  inserted or compared, chains verified before they stay (new records after the
  cloud's head, or the whole chain read back under a savepoint).
* :mod:`~meshpoint.sync.push` — a pass: batches read in one source snapshot, each
  applied with its cursor in one cloud transaction; status (cursor and lag).
* :mod:`~meshpoint.sync.follow` — a pass as soon as the local file has new rows (and
  every interval), retried with backoff while the cloud is unreachable (``sync
  --follow``; ``serve`` with a ``sync:`` section).

It imports the store and the history's verification; the CLI (``meshpoint sync``,
:mod:`meshpoint.cli.sync`) imports it. This module imports nothing: the store loads
:mod:`~meshpoint.sync.tables` while it is itself being imported. Use
``from meshpoint.sync.push import Syncer``.
"""
