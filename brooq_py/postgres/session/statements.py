"""Named SQL statements: loaded once from ``sql/*.sql``, rendered per schema.

Each file holds one statement with ``{job}``, ``{engine}``, ``{job_in_flight}``, ``{job_edge}``, ``{job_wait}``, ``{topic_setting}``,
``{schedule_tick}``,
``{version_table}`` (the tables), ``{depth_seq}`` (the depth caps' sequence, migration 0014, as a
text literal for ``to_regclass``),
``{channel}`` (the wake-up channel as an identifier), ``{channel_literal}`` (as text) or
``{stage_channel}`` (the stager's channel, ``{stage_channel_literal}`` as text), ``{cancel_channel}``
(the cancel channel), ``{settled_channel}`` / ``{settled_channel_literal}`` (the results channel),
``{depth_room}`` and ``{job_row_columns}`` (the fragments of those names, see ``_FRAGMENTS``)
placeholders and psycopg ``%(name)s`` parameters. A Store renders every
statement once for its schema with ``psycopg.sql.Identifier`` and never sets
``search_path`` on a connection.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

from psycopg import sql

from brooq_py.postgres.channel import cancel_channel_for, channel_for, settled_channel_for, stage_channel_for

_BINARY_PLACEHOLDER = re.compile(r"%\((\w+)\)b")


@functools.cache
def load(name: str) -> str:
    """Return the text of ``sql/<name>.sql`` (read once per process)."""
    path = resources.files("brooq_py.postgres") / "sql" / f"{name}.sql"
    text: str = path.read_text(encoding="utf-8")
    return text


@dataclass(frozen=True)
class Query:
    """One statement rendered for a schema: bytes for psycopg, text for a foreign Tx.

    ``rows`` is False for a statement that returns no rows (no RETURNING): a
    runner then reads nothing back.
    """

    name: str
    composed: bytes
    text: str
    rows: bool = True


def _fragment(name: str, schema: str) -> sql.Composed:
    """``sql/<name>.sql`` rendered for *schema*, without its comment lines, to stand inside a statement."""
    text = "\n".join(line for line in load(name).splitlines() if not line.lstrip().startswith("--"))
    return sql.SQL(text).format(job=sql.Identifier(schema, "job"), depth_seq=_depth_seq(schema))


# Files that are parts of statements, not statements: ``{name}`` in a statement stands for one.
_FRAGMENTS = ("depth_room", "job_row_columns")


def _depth_seq(schema: str) -> sql.Composable:
    return sql.Literal(sql.Identifier(schema, "job_depth_seq").as_string(None))


def render(name: str, schema: str, *, rows: bool = True) -> Query:
    """Render ``sql/<name>.sql`` for *schema* (*rows*: see ``Query``)."""
    template = sql.SQL(load(name))
    shared = {
        f: _fragment(f, schema) if "{" + f + "}" in template.as_string(None) else sql.SQL("")
        for f in _FRAGMENTS
    }
    composed = template.format(
        **shared,
        job=sql.Identifier(schema, "job"),
        engine=sql.Identifier(schema, "engine"),
        job_in_flight=sql.Identifier(schema, "job_in_flight"),
        job_edge=sql.Identifier(schema, "job_edge"),
        job_wait=sql.Identifier(schema, "job_wait"),
        topic_setting=sql.Identifier(schema, "topic_setting"),
        schedule_tick=sql.Identifier(schema, "schedule_tick"),
        depth_seq=_depth_seq(schema),
        version_table=sql.Identifier(schema, "brooq_alembic_version"),
        channel=sql.Identifier(channel_for(schema)),
        channel_literal=sql.Literal(channel_for(schema)),
        stage_channel=sql.Identifier(stage_channel_for(schema)),
        stage_channel_literal=sql.Literal(stage_channel_for(schema)),
        cancel_channel=sql.Identifier(cancel_channel_for(schema)),
        settled_channel=sql.Identifier(settled_channel_for(schema)),
        settled_channel_literal=sql.Literal(settled_channel_for(schema)),
    )
    # A foreign Tx gets the text with plain %(name)s placeholders: binary ones are psycopg's own.
    text = _BINARY_PLACEHOLDER.sub(r"%(\1)s", composed.as_string(None))
    return Query(name, composed.as_bytes(None), text, rows)


class Queries:
    """Every statement the Store runs, rendered once for one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._rendered: dict[str, Query] = {}
        self.enqueue = render("job_enqueue", schema)
        self.enqueue_plain = render("job_enqueue_plain", schema, rows=False)
        self.enqueue_many = render("job_enqueue_many", schema)
        self.get_by_key = render("job_get_by_key", schema)
        self.get_by_keys = render("job_get_by_keys", schema)
        self.get = render("job_get", schema)
        self.cancel = render("job_cancel", schema)
        self.claim = render("job_claim", schema)
        self.settle_many = render("job_settle_many", schema)
        self.settle_one = render("job_settle_one", schema)
        self.beat = render("engine_beat", schema)
        self.reap = render("lease_reap", schema)
        self.delete_terminal = render("job_delete_terminal", schema)
        self.ping = render("ping", schema)
        self.listen = render("listen", schema)

    def __getitem__(self, name: str) -> Query:
        """Return ``sql/<name>.sql`` rendered for this schema (rendered once, on first use)."""
        query = self._rendered.get(name)
        if query is None:
            query = self._rendered[name] = render(name, self.schema)
        return query
