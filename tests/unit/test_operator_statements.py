"""Every operator statement (the README's and the demo's psql queries) renders for a schema and prints
as a statement an operator can paste: no placeholder of the Store's left in it."""

from __future__ import annotations

import re

import pytest

from brooq_py.postgres.operator.stats import DEMO, OPS, statement, text


@pytest.mark.parametrize("name", sorted([*OPS, *DEMO]))
def test_every_operator_statement_renders_and_prints_without_placeholders(name: str) -> None:
    rendered = statement(name, "some_schema").as_string(None)
    assert '"some_schema"' in rendered
    if name in OPS:  # the ones the README and the demo print for psql
        assert re.search(r"\{\w+\}", text(name)) is None, text(name)
