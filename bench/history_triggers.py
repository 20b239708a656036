"""The workflow release beside a terminal history, with the triggers' functions of migration 0023
(``FROM job``: every day's table too) against those of 0024 (``FROM ONLY job``).

    .venv/bin/python bench/history_triggers.py [PAIRS] [ROUNDS] [TERMINAL]

Two schemas, one at 0023 and one at head, each with TERMINAL ended jobs in 30 days of history;
an engine (4 workers) drains PAIRS parents, each with a child after it, in each, alternating.
"""

from __future__ import annotations

import statistics
import sys
from contextlib import ExitStack

import psycopg
from history import _drain_workflows, _fill_history
from psycopg import sql
from util import fresh_schema, store_on

DSN = "postgresql://root@127.0.0.1:5432/test"


def main(pairs: int = 200, rounds: int = 2, terminal: int = 60_000) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"0023": [], "head": []}
    with ExitStack() as stack:
        envs = []
        for rev in rates:
            schema = stack.enter_context(fresh_schema(DSN, "wf" + rev[:2], revision=rev))
            store = stack.enter_context(store_on(DSN, schema, max_size=8))
            conn = stack.enter_context(psycopg.connect(DSN, autocommit=True))
            _fill_history(store, conn, schema, terminal, 30)
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "job")))
            envs.append((rev, store, conn, schema))
        for r in range(rounds):
            for rev, store, conn, schema in envs if r % 2 == 0 else envs[::-1]:
                rates[rev].append(_drain_workflows(store, conn, schema, pairs, f"wf{r}"))
                print(f"{rev}: {rates[rev][-1]:,.0f} jobs/s", flush=True)
    medians = {rev: statistics.median(xs) for rev, xs in rates.items()}
    print(
        f"medians: 0023 {medians['0023']:,.0f}, head {medians['head']:,.0f} jobs/s; "
        f"head / 0023 {medians['head'] / medians['0023']:.1f}"
    )
    return rates


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
