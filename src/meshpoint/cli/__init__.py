"""The ``meshpoint`` command line, one module per command group.

* :mod:`~meshpoint.cli.main`: the application and its top-level commands (``demo``,
  ``serve``, ``submit``, ``migrate``, ``stats``, ...);
* :mod:`~meshpoint.cli.tasks`: ``tasks list|show|approve|deny|reply|cancel|cost`` and
  ``recover``;
* :mod:`~meshpoint.cli.details`: one task as ``tasks show`` and the dashboard show it;
* :mod:`~meshpoint.cli.history`: ``verify``, ``purge`` and ``keys`` (the history's
  chains, retention and key ring);
* :mod:`~meshpoint.cli.events`: ``events`` (query and follow) and ``tasks reconstruct``;
* :mod:`~meshpoint.cli.broker`: ``nats-config`` (a NATS user per agent, client and
  approver) and ``keys approver new``;
* :mod:`~meshpoint.cli.dashboard`: ``dashboard`` (serves :mod:`meshpoint.ops.dashboard`);
* :mod:`~meshpoint.cli.gateway`: ``gateway`` (the mesh's agents as A2A servers over HTTP);
* :mod:`~meshpoint.cli.sync`: ``sync`` (push a local SQLite store to a cloud PostgreSQL
  one, once or ``--follow``), ``sync status`` and ``sync conflicts``;
* :mod:`~meshpoint.cli.common`: what every group shares (options, output, errors).

The CLI may import every other part of meshpoint; nothing imports the CLI but the
demos (for their output) and the dashboard (its store opener and readers).
``meshpoint = "meshpoint.cli:app"`` is the console script.
"""

from meshpoint.cli.main import app

__all__ = ["app"]
