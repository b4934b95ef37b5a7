"""Alembic migrations of the store (``versions/``), and helpers they share."""
