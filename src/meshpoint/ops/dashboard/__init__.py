"""The web dashboard (``meshpoint dashboard``): the operators' and approvers' view of
one tenant's store, server-rendered, with no build step and nothing fetched from
elsewhere: its templates and static files ship in the package.

* :mod:`~meshpoint.ops.dashboard.app`: the Starlette application, its routes, and how a
  write (approve, deny, reply) is checked and recorded;
* :mod:`~meshpoint.ops.dashboard.views`: what each page reads, through the store's and
  the CLI's readers (no SQL of its own), and the overview's live targets;
* :mod:`~meshpoint.ops.dashboard.forms`: the approval form built from a tool's JSON
  schema, and the edit a submitted form makes;
* :mod:`~meshpoint.ops.dashboard.security`: the token, the signed session, the CSRF
  token, and why a write is refused;
* ``templates/`` (Jinja2) and ``static/`` (CSS, the live events page's script).

It may import the store, the history, the event log, the runtime's approvals and
the CLI's readers (:mod:`meshpoint.cli.details`); nothing imports it but the CLI.
"""

from meshpoint.ops.dashboard.app import create_app

__all__ = ["create_app"]
