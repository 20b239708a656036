"""Side tables, triggers and the invariant checks of the fault-injection suite (SPEC P1-P3).

Everything is read from the database alone, on the database clock:

- ``chaos_exec``: one row per handler execution (the worker process writes it): job id,
  worker, attempt, claim token, start and end from ``clock_timestamp()``, and how it ended.
- ``chaos_audit``: an AFTER UPDATE trigger on ``job`` logs every row change (old/new state,
  claim token, holder, lease end, attempts, crashes) with ``clock_timestamp()`` and the
  statement's ``now()``.
- ``chaos_beat``: a trigger on ``engine`` logs every proof of life (seen_at, lease + margin,
  dropped claims) and every engine row removed, so a reap can be checked against what the
  engine table said when the reaper looked (SPEC P1'').
- ``chaos_violation``: a BEFORE UPDATE/DELETE trigger logs any change to a row that was already
  terminal (P3). It logs rather than raises, so the library's statement runs as it would in
  production and the check sees what it really did.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

TERMINAL = ("done", "dead", "canceled")

_SETUP = """
CREATE TABLE {s}.chaos_exec (
    claim_token uuid PRIMARY KEY,
    job_id uuid NOT NULL,
    worker text NOT NULL,
    attempt int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz,
    how text
);
CREATE TABLE {s}.chaos_audit (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    job_id uuid NOT NULL,
    old_state text, new_state text,
    old_token uuid, new_token uuid,
    old_locked_until timestamptz, new_locked_until timestamptz,
    old_attempts int, new_attempts int,
    old_crashes int, new_crashes int,
    old_locked_by text,
    stmt_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {s}.chaos_beat (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    engine_id text NOT NULL,
    seen_at timestamptz,
    grace interval,
    dropped uuid[]
);
CREATE TABLE {s}.chaos_violation (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    job_id uuid NOT NULL,
    op text NOT NULL,
    old_state text, new_state text
);
CREATE FUNCTION {s}.chaos_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.chaos_audit (job_id, old_state, new_state, old_token, new_token,
                                 old_locked_until, new_locked_until, old_attempts, new_attempts,
                                 old_crashes, new_crashes, old_locked_by)
    VALUES (NEW.id, OLD.state, NEW.state, OLD.claim_token, NEW.claim_token,
            OLD.locked_until, NEW.locked_until, OLD.attempts, NEW.attempts,
            OLD.crashes, NEW.crashes, OLD.locked_by);
    RETURN NULL;
END $$;
CREATE FUNCTION {s}.chaos_beat_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO {s}.chaos_beat (engine_id) VALUES (OLD.id);
        RETURN OLD;
    END IF;
    INSERT INTO {s}.chaos_beat (engine_id, seen_at, grace, dropped)
    VALUES (NEW.id, NEW.seen_at, NEW.lease + NEW.margin, NEW.dropped);
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_beat AFTER INSERT OR UPDATE OR DELETE ON {s}.engine
    FOR EACH ROW EXECUTE FUNCTION {s}.chaos_beat_fn();
CREATE FUNCTION {s}.chaos_terminal_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('done', 'dead', 'canceled') THEN
        INSERT INTO {s}.chaos_violation (job_id, op, old_state, new_state)
        VALUES (OLD.id, TG_OP, OLD.state, CASE WHEN TG_OP = 'UPDATE' THEN NEW.state END);
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_audit AFTER UPDATE ON {s}.job FOR EACH ROW EXECUTE FUNCTION {s}.chaos_audit_fn();
CREATE TRIGGER chaos_terminal BEFORE UPDATE OR DELETE ON {s}.job
    FOR EACH ROW EXECUTE FUNCTION {s}.chaos_terminal_fn();
"""


# Seconds within which a beat written before a reap may still have been uncommitted when the
# reaper's snapshot was taken (a generous bound for a commit on a loaded machine).
COMMIT_WINDOW = 1.0


def _reap_unjustified(
    beats: list[tuple[Any, ...]], engine: str, token: str, locked_until: Any, now: Any, wrote: Any
) -> str:
    """Why a reap of *token*, held by *engine*, was not justified by the engine table, or "" when it
    was (SPEC P1'').

    *now* is the reaper's statement time and *wrote* the clock when it changed the row: its snapshot
    was taken in between (after the statement's start, planning included, and before its write). A
    beat is (engine, seen_at, grace, dropped, at): ``at`` is the clock when its statement wrote the
    row (a removal has no seen_at). The engine's last beat written before *now* may not have
    committed yet (within COMMIT_WINDOW), the one before it had (one heartbeat at a time); a beat
    written between *now* and *wrote* may have committed before the snapshot. So the reaper saw one
    of those (or no row), and the reap is justified when what any of them showed justifies it."""
    mine = [b for b in beats if b[0] == engine]
    if any(b[3] and token in {str(t) for t in b[3]} for b in mine if b[4] < wrote):
        return ""  # the engine named the claim as dropped
    before = [b for b in mine if b[4] < now]
    seen: list[tuple[Any, ...] | None] = [None, *before][-2:]
    if before and (now - before[-1][4]).total_seconds() > COMMIT_WINDOW:
        seen = seen[-1:]  # written long enough before the reap to have committed: the reaper saw it
    seen += [b for b in mine if now <= b[4] < wrote]
    why = ""
    for b in seen:
        if b is None or b[1] is None:  # no row (yet, or removed)
            if locked_until is not None and locked_until < now:
                return ""
            why = why or f"no engine row and its lease ends {locked_until}"
        elif b[1] + b[2] < now:
            return ""  # its proof of life had run out
        else:
            why = f"its engine's proof of life at {b[1]} held until {b[1] + b[2]}"
    return why


def install(dsn: str, schema: str) -> None:
    """Create the side tables and triggers in *schema* (already migrated)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(_SETUP).format(s=sql.Identifier(schema)))  # type: ignore[arg-type]


@dataclass
class Report:
    """What a run left in the database, and every invariant that did not hold."""

    jobs: int = 0
    states: dict[str, int] = field(default_factory=dict)
    executions: int = 0
    claims: int = 0
    reaps: int = 0
    overlaps_after_lost_lease: int = 0
    problems: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)

    def assert_ok(self) -> None:
        assert not self.problems, "invariants broken:\n" + "\n".join(self.problems)


def _rows(conn: psycopg.Connection[Any], query: str, schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema))).fetchall()  # type: ignore[arg-type]


def check(
    dsn: str,
    schema: str,
    expected_ids: set[str],
    *,
    parent_topic: str = "chaos",
    child_topic: str = "chaos.child",
    allow_waiting: bool = False,
) -> Report:
    """Check P1-P3 for the jobs *expected_ids* (the parents enqueued by the test).

    - none lost: every expected job exists and is terminal (or, with *allow_waiting*,
      pending/failed, i.e. legitimately waiting); none is left processing;
    - P3: no row changed after it became terminal (the trigger's log is empty);
    - P1: two executions of one job overlap in time only if the first one's claim had
      been taken away (reaped) before the second started; every reap (a return to pending
      that counts a crash) happened when the engine table said the holder was gone: its last
      proof of life before the reaper's statement older than lease + margin, or the claim
      named dropped, or, with no engine row, the row's own lease ended (database clock);
    - attempts (SPEC C1, L5'): for each job, attempts = claims - give-backs - reaps, and for a
      terminal job claimed at least once, attempts = recorded failures + 1 (the claim that
      settled it), when nothing was given back;
    - every execution belongs to a real claim of its job with the same attempt number;
    - C9: chained children exist exactly for the parents that ended done, one each.
    """
    r = Report()
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = {
            str(row[0]): row
            for row in _rows(conn, "SELECT id, topic, state, attempts, payload FROM {s}.job", schema)
        }
        audit = _rows(
            conn,
            "SELECT job_id, at, old_state, new_state, old_token, new_token, old_locked_until,"
            " new_locked_until, old_attempts, new_attempts, old_crashes, new_crashes, old_locked_by,"
            " stmt_at FROM {s}.chaos_audit ORDER BY seq",
            schema,
        )
        beats = _rows(
            conn, "SELECT engine_id, seen_at, grace, dropped, at FROM {s}.chaos_beat ORDER BY seq", schema
        )
        execs = _rows(
            conn,
            "SELECT job_id, claim_token, worker, attempt, started_at, ended_at, how"
            " FROM {s}.chaos_exec ORDER BY started_at",
            schema,
        )
        violations = _rows(conn, "SELECT job_id, op, old_state, new_state FROM {s}.chaos_violation", schema)

    parents = {i: jobs[i] for i in expected_ids if i in jobs}
    r.jobs = len(parents)
    r.executions = len(execs)
    for i in sorted(expected_ids - set(jobs)):
        r.fail(f"lost: job {i} does not exist")
    ok_states = set(TERMINAL) | ({"pending", "failed"} if allow_waiting else set())
    states: dict[str, int] = defaultdict(int)
    for i, (_id, _topic, state, _att, _payload) in parents.items():
        states[state] += 1
        if state not in ok_states:
            r.fail(f"job {i} ended in state {state}")
    r.states = dict(states)
    for job_id, op, old, new in violations:
        r.fail(f"P3: terminal row {job_id} changed by {op}: {old} -> {new}")

    # Per job: claims (token changes into processing), give-backs, reaps, failures.
    claims: dict[str, dict[str, tuple[Any, int]]] = defaultdict(dict)  # job -> token -> (claimed at, attempt)
    ended: dict[str, Any] = {}  # token -> when its claim ended (left processing or token replaced)
    reaped_tokens: set[str] = set()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job_id, at, old_s, new_s, old_t, new_t, old_lu, _new_lu, old_a, new_a, old_c, new_c, by, now in audit:
        j = str(job_id)
        if new_s == "processing" and (old_s != "processing" or old_t != new_t):
            claims[j][str(new_t)] = (at, new_a)
            counts[j]["claims"] += 1
            r.claims += 1
            if new_a != (old_a or 0) + 1:
                r.fail(f"C1: claim of {j} set attempts {old_a} -> {new_a}")
        if old_s == "processing" and (new_s != "processing" or old_t != new_t):
            ended[str(old_t)] = at
            if new_s == "pending" and new_c == old_c + 1:
                counts[j]["reaped"] += 1
                r.reaps += 1
                reaped_tokens.add(str(old_t))
                if new_a != max(old_a - 1, 0):
                    r.fail(f"L5': reap of {j} set attempts {old_a} -> {new_a} (a crash gives it back)")
                why = _reap_unjustified(beats, by, str(old_t), old_lu, now, at)
                if why:
                    near = [
                        f"(seen {b[1]}, dropped {len(b[3] or [])}, at {b[4]})"
                        for b in beats
                        if b[0] == by and abs((b[4] - now).total_seconds()) < 3
                    ]
                    r.fail(
                        f"P1'': {j} returned to pending at {now} (written {at}) from {by}: {why}; "
                        f"its beats then: {' '.join(near)}"
                    )
            elif new_a == old_a - 1:
                counts[j]["given_back"] += 1
            if new_s == "failed":
                counts[j]["failed"] += 1
        if old_s == "processing" and new_s == "processing" and old_t != new_t:
            r.fail(f"P1: {j} claimed again while processing under another token")

    for j, (_id, _topic, state, attempts, _payload) in jobs.items():
        c = counts.get(j, {})
        expect = c.get("claims", 0) - c.get("given_back", 0) - c.get("reaped", 0)
        if attempts != expect:
            r.fail(f"C1: job {j} attempts={attempts}, but claims-given back-reaped={expect} ({dict(c)})")
        if state in TERMINAL and c.get("claims", 0) and not c.get("given_back", 0):
            settling = 1 if state in ("done", "dead") or _canceled_in_processing(audit, j) else 0
            form = c.get("failed", 0) + settling
            if attempts != form:
                r.fail(
                    f"L5': job {j} ({state}) attempts={attempts} but failures {c.get('failed', 0)}"
                    f" + settling {settling} = {form}"
                )

    # Executions: each belongs to a claim of its job; overlaps only after a lost lease.
    by_job: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for e in execs:
        j, token = str(e[0]), str(e[1])
        by_job[j].append(e)
        claim = claims.get(j, {}).get(token)
        if claim is None:
            r.fail(f"P1: execution of {j} under token {token} that no claim handed out")
        elif claim[1] != e[3]:
            r.fail(f"C2: execution of {j} saw attempt {e[3]}, its claim set {claim[1]}")
    for j, es in by_job.items():
        for a_i, first in enumerate(es):
            for second in es[a_i + 1 :]:
                end = first[5]
                if end is not None and end <= second[4]:
                    continue
                # overlapping: the first claim must have been reaped before the second started
                tok = str(first[1])
                if tok in reaped_tokens and ended.get(tok) is not None and ended[tok] <= second[4]:
                    r.overlaps_after_lost_lease += 1
                    continue
                r.fail(
                    f"P1: executions of {j} overlap: {first[2]} attempt {first[3]} "
                    f"[{first[4]} .. {end}] and {second[2]} attempt {second[3]} from {second[4]}"
                )

    # C9: children exactly for the parents that ended done (and asked for one).
    children: dict[str, int] = defaultdict(int)
    for _id, topic, _state, _att, payload in jobs.values():
        if topic == child_topic and isinstance(payload, dict) and "parent" in payload:
            children[str(payload["parent"])] += 1
    for i, (_id, _topic, state, _att, payload) in parents.items():
        wants = isinstance(payload, dict) and bool(payload.get("chain"))
        n = children.get(i, 0)
        if wants and state == "done" and n != 1:
            r.fail(f"C9: done parent {i} has {n} children")
        if (not wants or state != "done") and n:
            r.fail(f"C9: parent {i} in state {state} has {n} children")
    for parent in children:
        if parent not in parents:
            r.fail(f"C9: child of unknown parent {parent}")
    return r


def _canceled_in_processing(audit: list[tuple[Any, ...]], job_id: str) -> bool:
    return any(str(a[0]) == job_id and a[2] == "processing" and a[3] == "canceled" for a in audit)
