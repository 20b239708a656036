"""Jobs to enqueue, enqueue results, rows as stored, states and leases, and the errors that carry a row (SPEC E4', L5')."""

from __future__ import annotations

import enum
import json
import math
import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, NamedTuple

from brooq_py.queue.errors import BrooqError, InvalidJob

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# In UTF-8 bytes, so an index row of (topic, key) stays below the ~2,700 bytes PostgreSQL indexes.
MAX_TOPIC_BYTES = 255
MAX_KEY_BYTES = 1024
MAX_META_BYTES = 4096
# What jsonb's numeric holds: 131,072 digits before the point, 16,383 after; a huge exponent is refused first.
_NUMERIC_MAX_INT_DIGITS = 131_072
_NUMERIC_MAX_SCALE = 16_383
_NUMERIC_MAX_EXPONENT = (2**31 - 1) // 2
# What one jsonb value holds (a string, or an array or object's entries): 2**28 - 1 bytes. Its parser
# keeps an array's values (32 bytes each) and an object's pairs (72) in a buffer that doubles, up to
# 1 GB: at most 2**24 values and 2**23 pairs. Only a text of 2**25 characters or more can hold that
# many (two a value), so shorter ones are not walked.
_JSONB_MAX_BYTES = 2**28 - 1
_JSONB_MAX_VALUES = 2**24
_JSONB_MAX_PAIRS = 2**23
_JSONB_WALK_FROM = 2**25
_NUMBER = re.compile(r"-?(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?")

# A "\u0000" escape, not the storable text "\\u0000" (an escaped backslash, then "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): fine in a pair, refused by jsonb alone.
_SURROGATE_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F]")
# One encoder for every payload: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


class State(enum.StrEnum):
    """Where a job stands.

    ``scheduled`` waits for its ``available_at`` and ``failed`` for its backoff (not a verdict);
    the stager makes both pending when due. ``blocked`` waits for its parents (``Job.after``):
    the last one done releases it, one dead or canceled cancels it; a member of a sequence
    (``Job.sequence``) waits there for the member before it. ``parked`` waits for room under a
    parking depth cap (``set_max_depth(..., park=True)``): the oldest are released as room appears.
    """

    PENDING = "pending"
    SCHEDULED = "scheduled"
    PROCESSING = "processing"
    FAILED = "failed"
    DONE = "done"
    DEAD = "dead"
    CANCELED = "canceled"
    BLOCKED = "blocked"
    PARKED = "parked"

    @property
    def terminal(self) -> bool:
        return self in (State.DONE, State.DEAD, State.CANCELED)


TERMINAL_STATES = frozenset({State.DONE, State.DEAD, State.CANCELED})
ACTIVE_STATES = frozenset(State) - TERMINAL_STATES


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _check_number(literal: str) -> float:
    """json.loads' ``parse_float`` hook: refuse what jsonb refuses and Python takes silently (1e999999)."""
    match = _NUMBER.fullmatch(literal)
    if match is None:  # pragma: no cover - json only calls this for its own number grammar
        raise ValueError(f"{literal[:40]!r} is not a JSON number")
    whole, fraction, exp_text = match.group(1), match.group(2) or "", match.group(3) or "0"
    too_far = len(exp_text.lstrip("+-").lstrip("0")) > 10  # int() of a huge exponent is costly
    exponent = 0 if too_far else int(exp_text)
    if too_far or abs(exponent) > _NUMERIC_MAX_EXPONENT:
        raise ValueError(f"number {literal[:40]!r} is outside what PostgreSQL jsonb holds")
    scale = max(0, len(fraction) - exponent)
    mantissa = whole + fraction
    first = len(mantissa) - len(mantissa.lstrip("0"))
    # The power of ten of the first significant digit (a zero has none: only its scale counts).
    magnitude = len(whole) - 1 - first + exponent if first < len(mantissa) else 0
    if scale > _NUMERIC_MAX_SCALE or magnitude >= _NUMERIC_MAX_INT_DIGITS:
        raise ValueError(f"number {literal[:40]!r} is outside what PostgreSQL jsonb holds")
    # jsonb gives it back in plain notation: without a scale an integer, which Python reads with int()
    # (at most sys.get_int_max_str_digits() digits), else a fraction it reads as a float (finite).
    if scale == 0:
        limit = sys.get_int_max_str_digits()
        if limit and magnitude + 1 > limit:
            raise ValueError(
                f"number {literal[:40]!r} comes back from jsonb as an integer of {magnitude + 1} digits;"
                f" Python reads at most {limit} (sys.get_int_max_str_digits)"
            )
    elif math.isinf(float(literal)):
        raise ValueError(f"number {literal[:40]!r} comes back from jsonb as a float Python reads as infinity")
    return 0.0


def encode_payload(payload: Any, what: str = "payload") -> str:
    """Return *payload* as JSON text (``bytes``: pre-encoded, validated); ``InvalidJob`` naming *what*
    for what jsonb cannot hold: not serialisable, NaN, Infinity, ``\\u0000``."""
    if isinstance(payload, bytes | bytearray | memoryview):
        try:
            text = bytes(payload).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidJob(f"{what} bytes are not UTF-8: {exc}") from None
        try:
            decoded = json.loads(text, parse_constant=_reject_constant, parse_float=_check_number)
        except (ValueError, RecursionError) as exc:
            raise InvalidJob(f"{what} bytes are not valid JSON: {exc}") from None
        # Python pairs surrogate escapes and keeps a lone one as a lone surrogate; jsonb refuses it.
        if "\\u" in text and _SURROGATE_ESCAPE.search(text) and not is_utf8(_ENCODER.encode(decoded)):
            raise InvalidJob(f"{what} bytes hold a lone surrogate escape, which PostgreSQL jsonb refuses")
    else:
        try:
            text = _ENCODER.encode(payload)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidJob(f"{what} is not JSON-serialisable: {exc}") from None
        if not text.isascii() and not is_utf8(text):  # ASCII text (the usual payload) holds no lone surrogate
            raise InvalidJob(f"{what} holds a lone surrogate, which is not valid Unicode text")
    if "\x00" in text or ("\\u0000" in text and _NUL_ESCAPE.search(text)):
        raise InvalidJob(f"{what} contains \\u0000, which PostgreSQL jsonb cannot store")
    if len(text) >= _JSONB_WALK_FROM and (why := _jsonb_refusal(text)) is not None:
        raise InvalidJob(f"{what} {why}")
    return text


class _Number(str):
    """A fraction's literal as the walk reads it: jsonb's numeric takes room by its digits and scale."""


class _Pairs(list[tuple[str, Any]]):
    """An object's pairs as the walk reads them, a repeated key's too (jsonb's parser holds them all)."""


class _TooLarge(Exception):
    pass


def _jsonb_refusal(text: str) -> str | None:
    """Why PostgreSQL's jsonb would refuse the JSON *text* (a long payload), or None: an array or an
    object past what its parser holds, or a container past _JSONB_MAX_BYTES as jsonb lays it out (a
    4-byte header, 4 bytes an entry, strings' UTF-8 bytes, numerics and containers aligned to 4), or
    its text past it. Only a text of _JSONB_WALK_FROM characters or more can be refused."""
    if (size := utf8_length(text)) > _JSONB_MAX_BYTES:
        return f"takes {size:,} bytes as JSON; PostgreSQL jsonb holds at most {_JSONB_MAX_BYTES:,}"
    value = json.loads(text, object_pairs_hook=_Pairs, parse_float=_Number)  # ints read as ints: faster
    try:
        _stored_size(value)
    except _TooLarge as exc:
        return str(exc)
    except RecursionError:  # nested deeper than this walk goes: jsonb's own limit then answers
        return None
    return None


def _stored_size(node: Any) -> int:
    """The bytes *node* takes inside a jsonb (a container: header, entries and data); raise _TooLarge."""
    if isinstance(node, _Number | int) and not isinstance(node, bool):
        return _numeric_size(str(node))
    if isinstance(node, str):
        return utf8_length(node)
    if not isinstance(node, list):  # true, false, null: an entry alone
        return 0
    if isinstance(node, _Pairs):
        if len(node) > _JSONB_MAX_PAIRS:
            raise _TooLarge(
                f"is an object of {len(node):,} keys; PostgreSQL jsonb holds at most {_JSONB_MAX_PAIRS:,}"
            )
        # Stored once a key (the last value), keys sorted by length then bytes, then the values.
        pairs = sorted(
            dict(node).items(), key=lambda kv: (len(b := kv[0].encode("utf-8", "surrogatepass")), b)
        )
        children: list[Any] = [k for k, _ in pairs] + [v for _, v in pairs]
    else:
        if len(node) > _JSONB_MAX_VALUES:
            raise _TooLarge(
                f"is an array of {len(node):,} values; PostgreSQL jsonb holds at most {_JSONB_MAX_VALUES:,}"
            )
        children = node
    data = 0
    for child in children:  # scalars here, not by a call each: a long payload has millions
        kind = type(child)
        if kind is int:
            data = ((data + 3) & ~3) + (
                (8 if child else 6) if -9999 <= child <= 9999 else _numeric_size(str(child))
            )
        elif kind is _Number:
            data = ((data + 3) & ~3) + _numeric_size(child)
        elif kind is str:
            data += len(child) if child.isascii() else utf8_length(child)
        elif kind is list or kind is _Pairs:
            data = ((data + 3) & ~3) + _stored_size(child)  # aligned to 4, as numerics are
    size = 4 + 4 * len(children) + data
    if size > _JSONB_MAX_BYTES:
        raise _TooLarge(
            f"takes more than {_JSONB_MAX_BYTES:,} bytes as jsonb stores it; PostgreSQL holds at most that"
        )
    return size


def _numeric_size(literal: str) -> int:
    """The bytes PostgreSQL's numeric takes for the JSON number *literal*: a 4-byte length, a header of
    2 bytes (4 when its scale or weight is large), 2 bytes a group of 4 significant digits."""
    match = _NUMBER.fullmatch(literal)
    if match is None:  # pragma: no cover - json only calls this for its own number grammar
        return 8
    whole, fraction, exp_text = match.group(1), match.group(2) or "", match.group(3) or "0"
    exponent = int(exp_text)
    scale = max(0, len(fraction) - exponent)
    digits = (whole + fraction).lstrip("0")
    significant = digits.rstrip("0")
    if not significant:
        return 4 + (2 if scale <= 63 else 4)
    low = exponent - len(fraction) + (len(digits) - len(significant))  # the power of ten of its last digit
    high = low + len(significant) - 1
    weight, groups = high // 4, high // 4 - low // 4 + 1
    return 4 + (2 if scale <= 63 and -64 <= weight <= 63 else 4) + 2 * groups


def encode_payloads(payloads: Sequence[Any]) -> str:
    """``encode_payload`` of a list as one array: one encoder call, each payload alone only when in doubt."""
    try:
        text = _ENCODER.encode(payloads if isinstance(payloads, list) else list(payloads))
    except (TypeError, ValueError, RecursionError):
        pass
    else:
        if (
            len(text) < _JSONB_WALK_FROM  # a longer batch: each payload measured alone, then the array
            and (text.isascii() or is_utf8(text))
            and "\x00" not in text
            and not ("\\u0000" in text and _NUL_ESCAPE.search(text))
        ):
            return text
    text = "[" + ",".join([encode_payload(p) for p in payloads]) + "]"
    # The batch is sent as one jsonb array: what it holds together, jsonb must hold too.
    if len(text) >= _JSONB_WALK_FROM and (why := _jsonb_refusal(text)) is not None:
        raise InvalidJob(f"the batch's payloads together (one jsonb array) {why}")
    return text


class UnreadablePayload(str):
    """A stored payload Python's json cannot read (a number written by psql beyond Python's int, an
    array nested deeper than its recursion): its JSON text, with ``error``. A row read with one shows
    the text; a claimed job with one ends dead without running (SPEC E4', L5')."""

    error: str

    def __new__(cls, text: str, error: str) -> UnreadablePayload:
        made = super().__new__(cls, text)
        made.error = error
        return made

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]  # copy and pickle
        return str(self), self.error


def read_payload(text: str | None) -> Any:
    """The payload of a row's JSON *text* (a statement's ``payload::text``): what json reads, or an
    UnreadablePayload, so one row written by psql never fails the statement that read it."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        return UnreadablePayload(text, f"{type(exc).__name__}: {exc}")


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: str, what: str) -> None:
    """Raise ``InvalidJob`` if *value* holds NUL or lone surrogates (PostgreSQL text cannot)."""
    if "\x00" in value:
        raise InvalidJob(f"{what} contains a NUL character")
    if not value.isascii() and not is_utf8(value):
        raise InvalidJob(f"{what} is not valid Unicode text")


def utf8_length(value: str) -> int:
    """The length of *value* in UTF-8 bytes (its characters when ASCII)."""
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))


def check_length(value: str, limit: int, what: str) -> None:
    """Raise ``InvalidJob`` if *value* is longer than *limit* UTF-8 bytes (the documented limits)."""
    if len(value) > limit or utf8_length(value) > limit:
        raise InvalidJob(f"{what} is {utf8_length(value)} bytes in UTF-8; at most {limit} are allowed")


def check_tenant(tenant: Any) -> None:
    """Raise ``InvalidJob`` unless *tenant* is None or a topic's kind of text: non-empty (``""`` is
    refused, not read as None: a tenant named by mistake would share the tenant of no name), no NUL,
    at most MAX_TOPIC_BYTES UTF-8 bytes."""
    if tenant is not None:
        _check_str(tenant, "tenant", MAX_TOPIC_BYTES)
        if not tenant:
            raise InvalidJob("tenant must not be empty (None is the tenant of no name)")


def _check_str(value: Any, what: str, limit: int) -> None:
    """Raise ``InvalidJob`` unless *value* is text PostgreSQL holds, at most *limit* UTF-8 bytes."""
    if not isinstance(value, str):
        raise InvalidJob(f"{what} must be a str or None, got {type(value).__name__}")
    check_text(value, what)
    check_length(value, limit, what)


@dataclass(frozen=True)
class Job:
    """A job to enqueue. Validated when built: bad input raises ``InvalidJob``."""

    topic: str
    payload: Any = None
    idempotency_key: str | None = None
    available_at: datetime | None = None
    priority: int = 0
    meta: Mapping[str, str] | None = None
    """A small string map carried to the handler (``claim.meta``); tracing puts ``traceparent`` here."""
    unique_key: str | None = None
    """At most one *active* job per (topic, unique_key); free again once the holder ends. ``""`` is None."""
    on_duplicate: Literal["keep", "merge", "replace"] = "keep"
    """What an enqueue does to the active holder of ``unique_key``: see API.md."""
    after: Sequence[str] = ()
    """Ids of jobs that must end ``done`` before this one may run (the job is ``blocked`` until then)."""
    sequence: str | None = None
    """Jobs of one (topic, sequence) run one at a time, in enqueue order (SPEC Q5). ``""`` is refused."""
    tenant: str | None = None
    """Whose job this is (SPEC T1-T3): a topic's claims go round-robin across its tenants, each may have
    a limit and a rate. Non-empty text as a topic is (no NUL, at most 255 UTF-8 bytes); None: the
    tenant of every job that names none."""

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str):
            raise InvalidJob(f"topic must be a str, got {type(self.topic).__name__}")
        if not self.topic:
            raise InvalidJob("topic must not be empty")
        check_text(self.topic, "topic")
        check_length(self.topic, MAX_TOPIC_BYTES, "topic")
        if self.idempotency_key is not None:
            _check_str(self.idempotency_key, "idempotency_key", MAX_KEY_BYTES)
        at = self.available_at
        if at is not None:
            if not isinstance(at, datetime):
                raise InvalidJob(f"available_at must be a datetime, got {type(at).__name__}")
            if at.tzinfo is None or at.tzinfo.utcoffset(at) is None:
                raise InvalidJob("available_at must be timezone-aware (a naive datetime is ambiguous)")
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, int):
            raise InvalidJob(f"priority must be an int, got {type(p).__name__}")
        if not INT32_MIN <= p <= INT32_MAX:
            raise InvalidJob(f"priority must fit a 32-bit signed int, got {p}")
        if isinstance(self.payload, float) and not math.isfinite(self.payload):
            raise InvalidJob("payload: NaN and Infinity are not valid JSON")
        meta = self.meta
        if meta is not None:
            if not isinstance(meta, Mapping):
                raise InvalidJob(f"meta must be a mapping of str to str, got {type(meta).__name__}")
            for k, v in meta.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise InvalidJob("meta must map str to str")
                check_text(k, "meta key")
                check_text(v, f"meta[{k!r}]")
            check_length(_ENCODER.encode(dict(meta)), MAX_META_BYTES, "meta as JSON")
        uk = self.unique_key
        if uk is not None:
            _check_str(uk, "unique_key", MAX_KEY_BYTES)
            if not uk:  # "" means no key, as it does for idempotency_key
                object.__setattr__(self, "unique_key", None)
        if self.on_duplicate not in ("keep", "merge", "replace"):
            raise InvalidJob(f"on_duplicate must be 'keep', 'merge' or 'replace', got {self.on_duplicate!r}")
        after = self.after
        if isinstance(after, str | bytes) or not isinstance(after, Sequence):
            raise InvalidJob("after must be a sequence of job ids")
        for parent in after:
            if not isinstance(parent, str):
                raise InvalidJob(f"after must hold job ids (str), got {type(parent).__name__}")
            try:  # the column is uuid[]: a malformed id would abort the caller's transaction
                uuid.UUID(parent)
            except ValueError:
                raise InvalidJob(f"after holds {parent[:60]!r}, which is not a job id (a UUID)") from None

        if self.sequence is not None:
            _check_str(self.sequence, "sequence", MAX_KEY_BYTES)
            if not self.sequence:
                raise InvalidJob("sequence must not be empty (None: no sequence)")
            if self.after:
                raise InvalidJob("a job in a sequence cannot also wait for parents (after=)")
        check_tenant(self.tenant)

    @property
    def key(self) -> str | None:
        """The idempotency key as stored: ``""`` and ``None`` both mean no key."""
        return self.idempotency_key or None

    def meta_json(self) -> str | None:
        """Return ``meta`` as JSON text, or None when the job carries none."""
        return None if not self.meta else _ENCODER.encode(dict(self.meta))

    def payload_json(self) -> str:
        """Return the payload as JSON text (see ``encode_payload``)."""
        return encode_payload(self.payload)


class GroupResult(NamedTuple):
    """What ``enqueue_group`` returns: the group's ids in input order, the fan-in job's id and the
    ``finally_`` job's id (None when not asked for)."""

    ids: list[str]
    then_id: str | None
    finally_id: str | None = None


@dataclass(frozen=True)
class AttemptError:
    """One failed attempt as recorded in the job's row (the last 20 are kept)."""

    attempt: int
    at: datetime
    error: str
    """``"ExceptionType: message"``."""
    traceback: str | None
    """The formatted traceback, at most 16 KiB (cut from the middle)."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "at": self.at.isoformat()}


EventKind = Literal["claimed", "done", "failed", "dead", "canceled", "requeued"]


@dataclass(frozen=True)
class Event:
    """Something that happened to a job, delivered after its commit (``Engine.on_event``)."""

    kind: EventKind
    job_id: str
    topic: str
    attempt: int
    error: str | None
    at: datetime


class EnqueueResult(NamedTuple):
    """What an enqueue returns: the job's id and whether this call created it."""

    id: str
    created: bool


@dataclass(frozen=True)
class Lease:
    """Who holds a claimed job and until when (database clock)."""

    locked_by: str
    locked_until: datetime


@dataclass(frozen=True)
class StepRecord:
    """A step the job recorded (SPEC DS1, DS5): ``ctx.step``, a sleep or a wait for a signal."""

    name: str
    """The step's identity: its name, "charge#2" for its second use in a run; a wait's is the signal's."""
    at: datetime
    """When it was recorded."""
    kind: Literal["step", "sleep", "wait"] = "step"
    until: datetime | None = None
    """A sleep's wake-up time, or the end of a wait's timeout; None for a step."""

    def to_json(self) -> dict[str, Any]:
        until = None if self.until is None else self.until.isoformat()
        return {**asdict(self), "at": self.at.isoformat(), "until": until}


@dataclass(frozen=True)
class JobRow:
    """One row of the job table, as ``Store.get`` returns it."""

    id: str
    topic: str
    payload: Any
    state: State
    attempts: int
    priority: int
    available_at: datetime
    locked_by: str | None
    locked_until: datetime | None
    last_error: str | None
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime
    result: Any = None
    """The handler's return value (decoded JSON); None until done."""
    errors: tuple[AttemptError, ...] = ()
    """One per failed attempt, oldest first, the last 20 kept."""
    progress: float | None = None
    progress_note: str | None = None
    meta: Mapping[str, str] = field(default_factory=dict)
    parents: tuple[str, ...] = ()
    """``Job.after``: the jobs this one waits for."""
    crashes: int = 0
    """How many engines stopped while running it; ``KindOptions.max_crashes`` of them make it dead."""
    steps: tuple[StepRecord, ...] = ()
    """The recorded steps, sleeps and waits, oldest first (``ctx.step``; SPEC DS5)."""
    waiting_for: str | None = None
    """The signal a scheduled job waits for (``ctx.wait_for``), or None."""
    sequence: str | None = None
    """``Job.sequence``: the jobs of one (topic, sequence) run one at a time."""
    tenant: str | None = None
    """``Job.tenant``."""

    def to_json(self) -> dict[str, Any]:
        """Return the row as a JSON-ready dict (datetimes in ISO 8601)."""

        def iso(d: datetime | None) -> str | None:
            return None if d is None else d.isoformat()

        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(
            state=str(self.state),
            available_at=iso(self.available_at),
            locked_until=iso(self.locked_until),
            created_at=iso(self.created_at),
            updated_at=iso(self.updated_at),
            errors=[e.to_json() for e in self.errors],
            meta=dict(self.meta),
            parents=list(self.parents),
            steps=[s.to_json() for s in self.steps],
        )
        return out


# The errors of ``result()`` carry the row, so they live beside it (errors.py stays a leaf).


class JobFailed(BrooqError):
    """``result()`` of a job that ended ``dead``; ``row`` is the job as stored."""

    def __init__(self, row: JobRow) -> None:
        self.row = row
        super().__init__(f"job {row.id} ({row.topic}) is dead: {row.last_error}")


class JobCanceled(BrooqError):
    """``result()`` of a job that ended ``canceled``; ``row`` is the job as stored."""

    def __init__(self, row: JobRow) -> None:
        self.row = row
        super().__init__(f"job {row.id} ({row.topic}) was canceled")
