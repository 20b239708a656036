"""The job page's place for durable steps and waits (SPEC DS1-DS5): read with getattr, so a row
without ``steps``/``waiting_for`` renders as before and a row with them shows them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from brooq_py.http.render import jinja_env, job_view
from brooq_py.queue import JobRow, State, StepRecord

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@dataclass(frozen=True)
class Step:
    name: str
    at: datetime


@dataclass(frozen=True)
class SteppedRow(JobRow):
    steps: tuple[Step, ...] = ()
    waiting_for: str | None = None


class Fake:
    def __init__(self, row: JobRow) -> None:
        self.row = row

    def get(self, _raw: str) -> JobRow:
        return self.row

    @staticmethod
    def guarded(_doing: str, action: Any, *args: Any) -> Any:
        return action(*args)

    @staticmethod
    def relatives(_job_id: str) -> list[Any]:
        return []


def page(row: JobRow) -> str:
    fake = Fake(row)
    view = job_view(fake, fake, row.id)  # type: ignore[arg-type]
    context = {
        **view,
        "url": lambda path, **q: path,
        "base": "",
        "csrf": "",
        "read_only": True,
        "signed_in": True,
        "login": True,
        "here": "/",
        "retryable": False,
        "cancelable": False,
        "request": type("R", (), {"query_params": {}})(),
    }
    return jinja_env().get_template("job.html").render(context)


def row(cls: type[JobRow] = JobRow, state: State = State.PROCESSING, **extra: Any) -> JobRow:
    return cls(
        id="01a24352-17a8-71eb-bca8-160cac737335", topic="t", payload={"a": 1}, state=state,
        attempts=1, priority=0, available_at=NOW, locked_by="w", locked_until=NOW, last_error=None,
        idempotency_key=None, created_at=NOW, updated_at=NOW, **extra,
    )  # fmt: skip


def test_a_row_without_steps_renders_no_steps_card() -> None:
    html = page(row())
    assert 'id="steps"' not in html and "Running: no result yet." in html


def test_a_row_with_steps_and_a_wait_shows_them_escaped() -> None:
    stepped = row(SteppedRow, steps=(Step("charge", NOW), Step("<mail>#2", NOW)), waiting_for="paid<x>")
    html = page(stepped)
    assert 'id="steps"' in html and "charge" in html and "&lt;mail&gt;#2" in html
    assert 'id="waiting-for"' in html and "paid&lt;x&gt;" in html


def test_the_timeline_names_each_step_sleep_and_wait_in_order() -> None:
    later = NOW.replace(hour=9)
    steps = (
        StepRecord("charge", NOW),
        StepRecord("sleep", NOW, kind="sleep", until=later),
        StepRecord("approval", NOW, kind="wait", until=later),
    )
    html = page(row(steps=steps, waiting_for="approval", state=State.SCHEDULED))
    kinds = [part.split('"', 1)[0] for part in html.split('data-kind="')[1:]]
    assert kinds == ["step", "sleep", "wait"]
    assert "slept until 2026-01-02 09:04:05 UTC" in html
    assert "waited for the signal, at most until 2026-01-02 09:04:05 UTC" in html
    assert 'id="waiting-for"' in html
