"""Integrations with frameworks; each is an optional extra (``brooq_py[django]``), never imported by the core."""
