"""``python -m meshpoint.cli``: the ``meshpoint`` command."""

from meshpoint.cli.main import app

app()
