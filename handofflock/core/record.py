"""The lock record: one JSON object, decoded strictly because anyone with bucket access can write it.

Wire format (version 1)::

    {"version": 1,
     "ownerId": "host:pid:ab12", "expiresAt": 1700000060.0,
     "waitingOwnerId": null, "waiterExpiresAt": null,
     "ttl": 60.0, "token": 1700000000123, "nonce": "9f2c..."}

In memory the record is nested: the owner in place (a :class:`Holder`) and
the waiter in place (a :class:`Waiter`), each None when absent, beside the
lock's ``ttl``, fencing ``token`` and write ``nonce``. Every field says its
JSON key and how it is read and written (:func:`wire`), so one line of a
dataclass below adds an optional field to the format.

Optional fields, written only when set: ``ownerInstance`` and
``waiterInstance`` (a random id of the lock instance in that place, so two
processes that share a stable owner id are never confused), ``waiterTtl`` (the
lease the waiter wants), ``heldSince`` (``{"at": ..., "token": ...}``: when
the current hold began, the write that took the lock or handed it over; it
counts only while the token it names is the record's), ``minHold``
(``{"seconds": ..., "token": ...}``, bound to its hold the same way: a
waiter's request is acted on only ``seconds`` after ``heldSince``),
``waitingSince`` (``{"at": ..., "id": ..., "instance": ...}``: when the
waiter in place began waiting, its own wall clock; the older of two waiters of
equal rank has the slot). ``ownerLabel`` and ``waiterLabel`` say who the owner
and the waiter are, for people: ``{"text": "host=gpu-3 pid=4242 pod=ml/train-0",
"instance": ..., "id": ...}`` with an optional ``"grace"`` (seconds the
holder allows its work to stop once asked). ``waiterRequest`` (``{"asks":
false, "priority": 0, "id": ..., "instance": ...}``: a patient waiter, which
waits without asking the holder to leave, and the rank of its request for the
single slot) and ``declinedWaiter`` (``{"id", "instance", "owner",
"ownerInstance"}``: the holder saw that waiter's request and declined it).

Labels, requests and declines name the place they speak of (its id and
instance): a writer that does not know them keeps them as unknown fields, and
when such a writer puts another owner or waiter in place they stop counting
instead of naming the wrong job; a waiter without a request asks, at priority
0, as older versions' waiters do.

The first four fields are the original design's and the only required ones: a
record written by another implementation with just those four is read
correctly (``token`` 0, no ``ttl``, no ``nonce``). Unknown fields, and fields
of an owner or waiter whose id is null, are kept and written back unchanged.
Anything else that is off raises
:class:`~handofflock.core.errors.LockRecordCorrupt` naming the object and the reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar, overload

import orjson

from .errors import ConfigurationError, LockRecordCorrupt

#: The format version this release writes and reads.
RECORD_VERSION = 1
#: Longest lease accepted in a record (a week): anything longer is a typo or an attack.
MAX_TTL = 7 * 24 * 3600.0
#: Latest timestamp accepted (year 3000): beyond that a record would never expire.
MAX_TIMESTAMP = 32_503_680_000.0
#: Longest owner or waiter id, in characters.
MAX_ID_LENGTH = 512
#: Longest label text, in characters.
MAX_LABEL_LENGTH = 256
#: Longest nonce, in characters.
MAX_NONCE_LENGTH = 128
#: Tokens are signed 64-bit so every fenced resource (SQL BIGINT, Go int64) can store them.
MAX_TOKEN = 2**63 - 1
#: The range of a waiter's priority (a signed 32-bit integer, as Apache Helix's lock priorities are ints).
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
#: Most bytes unknown fields may take, encoded. The known fields take under 5 KiB
#: even at their longest, so a record the lock writes back always fits the cap.
#: Records larger than this are refused without being read further.
MAX_RECORD_BYTES = 64 * 1024
MAX_EXTRA_BYTES = MAX_RECORD_BYTES - 8 * 1024

Corrupt = Callable[[str], LockRecordCorrupt]
#: ``read(value, key, corrupt, seen)``: the checked value of JSON ``value`` (None when absent), or raise
#: ``corrupt(reason)``. ``seen`` holds the fields of the same place read before it (id, instance).
Reader = Callable[[Any, str, Corrupt, dict[str, Any]], Any]
#: ``write(value, whole)``: the JSON of ``value``, a field of ``whole``; None writes nothing.
Writer = Callable[[Any, Any], Any]
#: ``problem(value, name)``: why ``value`` cannot be the field ``name``, or None if it can.
Problem = Callable[[Any, str], "str | None"]


def new_nonce() -> str:
    """A fresh nonce: 128 random bits, hex. Unique per write."""
    return os.urandom(16).hex()


@dataclass(frozen=True)
class Wire:
    """How one field is kept in the JSON object: its ``key``, read and written by ``read`` and ``write``.

    ``always``: written even when null (the four original fields, ``ttl``, ``token``, ``nonce``).
    """

    key: str
    read: Reader
    write: Writer
    always: bool


def wire(key: str, read: Reader, write: Writer | None = None, *, always: bool = False, default: Any = None) -> Any:
    """A dataclass field kept under JSON ``key``; with ``default=MISSING`` it is required while its place is filled."""
    spec = Wire(key, read, write or (lambda value, whole: value), always)
    return field(default=default, metadata={"wire": spec})


def _wired(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Wire]]:
    return ((f, f.metadata["wire"]) for f in dataclasses.fields(cls) if "wire" in f.metadata)


# --------------------------------------------------------------------------- reading fields


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the {'integer' if isinstance(value, int) else 'number'} {value}"
    names = {type(None): "null", str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def id_problem(value: Any, name: str) -> str | None:
    """Why ``value`` cannot be an owner or writer id, or None if it can.

    The one rule for ids: the decoder applies it to what it reads, and the
    constructors to what they will write, so nothing writes a record that
    its own decoder would call corrupt.
    """
    return _text_problem(value, name, MAX_ID_LENGTH, lambda c: c < 0x20 or c == 0x7F)


def label_problem(value: Any, name: str) -> str | None:
    """Why ``value`` cannot be a label's text, or None if it can (the decoder and constructors share it)."""
    return _text_problem(value, name, MAX_LABEL_LENGTH, lambda c: c < 0x20 or 0x7F <= c < 0xA0)


def _text_problem(value: Any, name: str, longest: int, control: Callable[[int], bool]) -> str | None:
    if not isinstance(value, str):
        return f"'{name}' must be a string, got {_json_type(value)}"
    if not value or len(value) > longest:
        return f"'{name}' must be 1-{longest} characters long"
    if any(control(ord(ch)) for ch in value):
        return f"'{name}' contains control characters"
    return None


def _must(
    kind: str,
    is_kind: Callable[[Any], bool],
    fits: Callable[[Any], bool] | None = None,
    within: str | None = None,
    *,
    got: Literal["value", "type", "nothing"] = "value",
    quoted: bool = True,
) -> Problem:
    """A :data:`Problem`: the value must be ``kind`` (``is_kind``), and then ``within`` (``kind`` if not given) what
    ``fits`` accepts. ``got`` says what the reason shows of a bad value: its JSON type when it is not ``kind`` and
    (``"value"``) the number itself when it does not fit; (``"type"``) its JSON type either way; or (``"nothing"``)
    nothing. ``quoted``: the field's name is quoted in the reason."""

    def problem(value: Any, name: str) -> str | None:
        right_kind = is_kind(value)
        if right_kind and (fits is None or fits(value)):
            return None
        field_name = f"'{name}'" if quoted else name
        shown = "" if got == "nothing" else f", got {value if right_kind and got == 'value' else _json_type(value)}"
        return f"{field_name} must be {within or kind if right_kind else kind}{shown}"

    return problem


def _or_null(problem: Problem) -> Problem:
    return lambda value, name: None if value is None else problem(value, name)


def _id(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        return f"'{name}' must be a string or null, got {_json_type(value)}"
    return None if value is None else id_problem(value, name)


_INSTANCE = f"1-{MAX_NONCE_LENGTH} ASCII letters or digits, or null"
_instance = _or_null(
    _must(_INSTANCE, _is_str, lambda v: 0 < len(v) <= MAX_NONCE_LENGTH and v.isascii() and v.isalnum(), got="nothing")
)
_YEAR_3000 = "a Unix time between 0 and year 3000"
_timestamp = _or_null(_must("a number or null", _is_number, lambda v: 0 <= v <= MAX_TIMESTAMP, _YEAR_3000))
_when = _must("a number", _is_number, lambda v: 0 <= v <= MAX_TIMESTAMP, _YEAR_3000)
_ttl = _or_null(_must("a finite number", _is_number, lambda v: 0 < v <= MAX_TTL, f"in (0, {MAX_TTL:.0f}] seconds"))
_token = _or_null(_must("an integer", _is_int, lambda v: 0 <= v <= MAX_TOKEN, "in [0, 2**63-1]"))
_nonce = _or_null(
    _must(
        f"a string of 1-{MAX_NONCE_LENGTH} characters", _is_str, lambda v: 0 < len(v) <= MAX_NONCE_LENGTH, got="nothing"
    )
)
_GRACE = f"a number of seconds in [0, {MAX_TTL:.0f}] (a week)"
_grace = _or_null(_must(_GRACE, _is_number, lambda v: 0 <= v <= MAX_TTL, got="type"))
#: A :class:`Label`'s own grace, named as the caller knows it.
_label_grace = _or_null(_must(_GRACE, _is_number, lambda v: 0 <= v <= MAX_TTL, got="type", quoted=False))
_priority = _must("an integer in [-2**31, 2**31-1]", _is_int, lambda v: MIN_PRIORITY <= v <= MAX_PRIORITY, got="type")
_asks = _must("true or false", lambda v: isinstance(v, bool))


def _reader(problem: Problem, convert: Callable[[Any], Any] = lambda v: v, null: Any = None) -> Reader:
    """A :data:`Reader` of a field that ``problem`` checks: ``null`` for null, else ``convert(value)``."""

    def read(value: Any, name: str, corrupt: Corrupt, seen: dict[str, Any]) -> Any:
        if (why := problem(value, name)) is not None:
            raise corrupt(why)
        return null if value is None else convert(value)

    return read


def _object(
    value: Any, name: str, corrupt: Corrupt, keys: dict[str, Problem], optional: str = "", checked: str = ""
) -> Any:
    """``value`` as an object with ``keys`` (but ``optional``) and no others, each checked (in the order of
    ``checked``, a space-separated list of them, where given); None for null."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise corrupt(f"'{name}' must be an object or null, got {_json_type(value)}")
    need = [key for key in keys if key != optional]
    if not set(need) <= value.keys() <= keys.keys():
        quoted = [f"'{key}'" for key in need]
        listing = ", ".join(quoted[:-1]) + " and " + quoted[-1]
        also = f" (and optionally '{optional}')" if optional else ""
        raise corrupt(f"'{name}' must have {listing}{also}, got keys {sorted(value)}")
    for key in checked.split() or keys:
        if (why := keys[key](value.get(key), f"{name}.{key}")) is not None:
            raise corrupt(why)
    return value


def _names(obj: dict[str, Any], place: tuple[str | None, str | None], prefix: str = "") -> bool:
    """Whether ``obj`` names ``place`` (id, instance; under the keys ``prefix`` and ``prefixInstance``), filled.

    A label, request or decline counts only while the place it was written for is still the one in
    place: an older writer that replaced that owner or waiter kept it as an unknown field.
    """
    return place[0] is not None and (obj[prefix or "id"], obj[f"{prefix}Instance" if prefix else "instance"]) == place


def _of(place: Holder | Waiter | None) -> tuple[str | None, str | None]:
    return (None, None) if place is None else (place.id, place.instance)


def _bound(
    make: Callable[[dict[str, Any]], Any],
    dump: Writer,
    keys: dict[str, Problem],
    listed: str,
    optional: str = "",
) -> tuple[Reader, Writer]:
    """The reader and writer of a value kept as an object written with the id and instance of the owner's or
    the waiter's place: ``make`` makes the value of the object, ``dump(value, place)`` the object of the value
    (None: nothing is written). It reads as None once another owner or waiter is in place (see :func:`_names`).
    ``listed``: the keys in the order a reason lists them (``keys``, then the id and instance, are checked in
    that order)."""
    every = {**keys, "instance": _instance, "id": _id}
    listing = {key: every[key] for key in listed.split()}
    checked = " ".join([*keys, "id", "instance"])

    def read(value: Any, name: str, corrupt: Corrupt, seen: dict[str, Any]) -> Any:
        obj = _object(value, name, corrupt, listing, optional, checked)
        if obj is None or not _names(obj, (seen["id"], seen["instance"])):
            return None
        return make(obj)

    return read, dump


def _of_hold(field: str, check: Problem) -> tuple[Reader, Writer]:
    """The reader and writer of ``{field: number, "token": ...}``, a number about the hold whose token it names.

    An older writer that took the lock (a new token) kept it as an unknown field: it is not this hold's (None).
    """

    def read(value: Any, name: str, corrupt: Corrupt, seen: dict[str, Any]) -> float | None:
        obj = _object(value, name, corrupt, {field: check, "token": _token})
        if obj is not None and obj[field] is None:
            raise corrupt(f"'{name}.{field}' must be a number, got null")
        if obj is None or seen["owner"] is None or (obj["token"] or 0) != seen["token"]:
            return None
        return float(obj[field])

    return read, lambda number, record: {field: number, "token": record.token}


def _declined(value: Any, name: str, corrupt: Corrupt, seen: dict[str, Any]) -> bool:
    obj = _object(value, name, corrupt, {"id": _id, "instance": _instance, "owner": _id, "ownerInstance": _instance})
    return obj is not None and _names(obj, _of(seen["waiter"])) and _names(obj, _of(seen["owner"]), "owner")


def _declined_json(declined: bool, record: LockRecord) -> dict[str, Any] | None:
    owner, waiter = record.owner, record.waiter
    if not declined or owner is None or waiter is None:
        return None
    return {"id": waiter.id, "instance": waiter.instance, "owner": owner.id, "ownerInstance": owner.instance}


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class Label:
    """Who a holder or waiter is, for people reading ``status``: free text, and the grace it allows.

    ``text`` is 1-256 printable characters (see :func:`label_problem`);
    ``grace`` is how many seconds the holder gives its work to stop once a
    release is asked for (``handofflock run --grace``), or None if it does not say.
    """

    text: str
    grace: float | None = None

    def __post_init__(self) -> None:
        problem = label_problem(self.text, "label") or _label_grace(self.grace, "a label's grace")
        if problem is not None:
            raise ConfigurationError(problem)


@dataclass(frozen=True)
class WaiterRequest:
    """What a waiter asks of the holder: ``asks`` (False: a patient waiter, the holder is never told),
    and its ``priority`` for the single waiter slot (higher takes the slot from lower; see :attr:`rank`)."""

    asks: bool = True
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.asks, bool):
            raise ConfigurationError(f"request_release must be True or False, got {self.asks!r}")
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, int) or not MIN_PRIORITY <= p <= MAX_PRIORITY:
            raise ConfigurationError(f"priority must be an integer in [-2**31, 2**31-1], got {p!r}")

    @property
    def rank(self) -> tuple[int, bool]:
        """Order of requests for the slot: priority first, then an asking request above a patient one."""
        return (self.priority, self.asks)


#: What a waiter without a ``waiterRequest`` wants (every waiter of older versions): it asks, at priority 0.
ASKING = WaiterRequest()
_label = _bound(
    lambda obj: Label(obj["text"], None if obj.get("grace") is None else float(obj["grace"])),
    lambda label, place: {
        "text": label.text,
        "instance": place.instance,
        "id": place.id,
        **({} if label.grace is None else {"grace": label.grace}),
    },
    {"text": label_problem, "grace": _grace},
    "text instance id grace",
    optional="grace",
)
#: Nothing is written for a request that only asks (what a waiter without one wants).
_request = _bound(
    lambda obj: WaiterRequest(obj["asks"], obj["priority"]),
    lambda request, place: (
        None
        if request == ASKING
        else {"asks": request.asks, "priority": request.priority, "id": place.id, "instance": place.instance}
    ),
    {"asks": _asks, "priority": _priority},
    "asks priority id instance",
)
_since = _bound(
    lambda obj: float(obj["at"]),
    lambda at, place: {"at": at, "id": place.id, "instance": place.instance},
    {"at": _when},
    "at id instance",
)


@dataclass(frozen=True)
class Holder:
    """The owner in place: its id, when its lease ends (wall clock), its instance and its label."""

    id: str = wire("ownerId", _reader(_id), always=True, default=MISSING)
    expires_at: float = wire("expiresAt", _reader(_timestamp, float), always=True, default=MISSING)
    instance: str | None = wire("ownerInstance", _reader(_instance))
    label: Label | None = wire("ownerLabel", *_label)  # noqa: RUF009 (a frozen value)

    def live(self, now: float, skew: float = 0.0) -> bool:
        """Whether the lease is unexpired at ``now`` (with ``skew`` grace)."""
        return now <= self.expires_at + skew


@dataclass(frozen=True)
class Waiter:
    """The waiter in place: its id, when its slot ends, the lease it wants (``ttl``), who it is, what it asks."""

    id: str = wire("waitingOwnerId", _reader(_id), always=True, default=MISSING)
    expires_at: float = wire("waiterExpiresAt", _reader(_timestamp, float), always=True, default=MISSING)
    ttl: float | None = wire("waiterTtl", _reader(_ttl, float))
    instance: str | None = wire("waiterInstance", _reader(_instance))
    label: Label | None = wire("waiterLabel", *_label)  # noqa: RUF009 (a frozen value)
    request: WaiterRequest = wire("waiterRequest", *_request, default=ASKING)  # noqa: RUF009 (a frozen value)
    #: When the acquire in this slot began waiting (its wall clock): at equal rank the older waiter has the slot.
    since: float | None = wire("waitingSince", *_since)

    def live(self, now: float, skew: float = 0.0) -> bool:
        """Whether the slot is unexpired at ``now`` (with ``skew`` grace)."""
        return now <= self.expires_at + skew


_PLACES: tuple[tuple[str, type[Holder | Waiter]], ...] = (("owner", Holder), ("waiter", Waiter))
_T = TypeVar("_T")


class Forward(Generic[_T]):
    """A read-only attribute that reads another object's: ``Forward("timing.ttl")`` is ``self.timing.ttl``.

    Where a value along the dotted ``path`` (but the last) is None, it reads ``absent``
    (``Forward("record.owner.id", None)``: None while there is no record, or no owner).
    """

    def __init__(self, path: str, absent: Any = None) -> None:
        self.path, self.absent = path.split("."), absent

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forward[_T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object, owner: type | None = None) -> _T | Forward[_T]:
        if obj is None:
            return self
        value: Any = obj
        for name in self.path:
            if value is None:
                return self.absent  # type: ignore[no-any-return]
            value = getattr(value, name)
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(f"{self.name} is read-only")


@dataclass(frozen=True)
class LockRecord:
    """What the lock object says. Immutable; derive changed copies with :meth:`replace`.

    ``owner`` and ``waiter`` are the two places, None while empty. ``ttl`` is
    the lease the owner writes with (kept once the lock is free). ``declined``:
    the owner in place declined the request of the waiter in place. ``extra``
    holds fields this version does not know (and those of an empty place),
    preserved across writes. ``legacy`` is True when the record had no
    ``version`` field (written by the original four-field design).
    """

    version: ClassVar[int] = RECORD_VERSION

    owner: Holder | None = None
    waiter: Waiter | None = None
    ttl: float | None = wire("ttl", _reader(_ttl, float), always=True)
    token: int = wire("token", _reader(_token, null=0), always=True, default=0)
    #: When the current hold began (wall clock): the write that took the lock or handed it over; renewals keep it.
    held_since: float | None = wire("heldSince", *_of_hold("at", _timestamp))
    #: How long the holder keeps the lock before a waiter's request is acted on (from ``held_since``).
    min_hold: float | None = wire("minHold", *_of_hold("seconds", _grace))
    nonce: str | None = wire("nonce", _reader(_nonce), always=True)
    declined: bool = wire("declinedWaiter", _declined, _declined_json, default=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    legacy: bool = field(default=False, compare=False)

    def waiter_live(self, now: float, skew: float = 0.0) -> bool:
        """Whether a waiter holds an unexpired slot at ``now`` (with ``skew`` grace)."""
        return self.waiter is not None and self.waiter.live(now, skew)

    def replace(self, **changes: Any) -> LockRecord:
        """A copy with ``changes`` applied; always written as the current version."""
        for place, cls in _PLACES:
            flat = {attr: changes.pop(name) for name, (p, attr) in _FLAT.items() if p == place and name in changes}
            if flat:
                current = getattr(self, place)
                values = {k: v for k, v in {**(vars(current) if current else {}), **flat}.items() if v is not None}
                changes[place] = cls(**values) if "id" in values else None
        # What was kept of a place while it was empty goes once the place is written.
        written = {spec.key for place, cls in _PLACES if place in changes for _, spec in _wired(cls)}
        if written & self.extra.keys():
            changes.setdefault("extra", {k: v for k, v in self.extra.items() if k not in written})
        return dataclasses.replace(self, legacy=False, **changes)

    # The original design's flat names for the places' fields: read-only views, None while the place is
    # empty. replace() takes them as well.
    owner_id = Forward[str | None]("owner.id")
    expires_at = Forward[float | None]("owner.expires_at")
    owner_instance = Forward[str | None]("owner.instance")
    owner_label = Forward[Label | None]("owner.label")
    waiting_owner_id = Forward[str | None]("waiter.id")
    waiter_expires_at = Forward[float | None]("waiter.expires_at")
    waiter_ttl = Forward[float | None]("waiter.ttl")
    waiter_instance = Forward[str | None]("waiter.instance")
    waiter_label = Forward[Label | None]("waiter.label")
    waiter_request = Forward[WaiterRequest | None]("waiter.request")
    waiting_since = Forward[float | None]("waiter.since")

    @property
    def request(self) -> WaiterRequest:
        """What the waiter in place wants (:data:`ASKING` without a waiter)."""
        return self.waiter.request if self.waiter else ASKING

    # -- wire format ------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"version": RECORD_VERSION}
        optional: dict[str, Any] = {}
        empty: set[str] = set()
        for whole, cls in ((self.owner, Holder), (self.waiter, Waiter), (self, LockRecord)):
            for f, spec in _wired(cls):
                value = getattr(whole, f.name) if whole is not None else None
                value = None if value is None else spec.write(value, whole)
                if spec.always:
                    doc[spec.key] = value
                elif value is not None:
                    optional[spec.key] = value
                if whole is None:
                    empty.add(spec.key)
        doc.update(optional)
        doc.update({k: v for k, v in self.extra.items() if k not in _KNOWN or k in empty})
        return doc

    def encode(self) -> bytes:
        """The record as compact JSON bytes."""
        doc = self.to_json()
        try:
            return orjson.dumps(doc)
        except orjson.JSONEncodeError:  # an unknown field holds an integer past 64 bits: keep it exact
            return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()

    @classmethod
    def decode(
        cls, data: bytes, *, key: str = "<lock>", generation: int | None = None, url: str | None = None
    ) -> LockRecord:
        """Parse and validate untrusted bytes; raise :class:`LockRecordCorrupt` on anything off.

        Never raises anything else, whatever the input (a property test holds it to that).
        """

        def corrupt(reason: str) -> LockRecordCorrupt:
            return LockRecordCorrupt(key, reason, generation=generation, url=url)

        doc = _parse(data, corrupt)
        missing = [k for k in _REQUIRED if k not in doc]
        if missing:
            raise corrupt(f"missing field(s) {', '.join(missing)}")
        legacy = "version" not in doc
        version = RECORD_VERSION if legacy else doc["version"]
        if (problem := _must("an integer", _is_int)(version, "version")) is not None:
            raise corrupt(problem)
        if version != RECORD_VERSION:
            raise corrupt(
                f"unsupported format version {version} (this handofflock reads version {RECORD_VERSION}); "
                "a newer handofflock may have written it: upgrade before touching this lock"
            )

        values: dict[str, Any] = {}
        kept: dict[str, Any] = {}  # the fields of an empty place, written back as they were
        for place, place_cls in _PLACES:
            seen: dict[str, Any] = {}
            for f, spec in _wired(place_cls):
                seen[f.name] = spec.read(doc.get(spec.key), spec.key, corrupt, seen)
            specs = list(_wired(place_cls))
            if seen["id"] is None:
                kept.update({spec.key: doc[spec.key] for f, spec in specs if seen[f.name] is not None})
                values[place] = None
                continue
            for f, spec in specs:
                if f.default is MISSING and seen[f.name] is None:
                    raise corrupt(f"'{specs[0][1].key}' is set but '{spec.key}' is null")
            values[place] = place_cls(**{k: v for k, v in seen.items() if v is not None})
        for f, spec in _wired(cls):
            values[f.name] = spec.read(doc.get(spec.key), spec.key, corrupt, values)
        extra = {**{k: v for k, v in doc.items() if k not in _KNOWN}, **kept}
        _check_extra(extra, corrupt)
        return cls(extra=extra, legacy=legacy, **values)


_KNOWN = frozenset({"version"} | {spec.key for c in (Holder, Waiter, LockRecord) for _, spec in _wired(c)})
_REQUIRED = [spec.key for c in (Holder, Waiter) for f, spec in _wired(c) if f.default is MISSING]
_FLAT = {name: tuple(view.path) for name, view in vars(LockRecord).items() if isinstance(view, Forward)}


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        keys = [key for key, _ in pairs]
        raise _DuplicateKey(next(key for i, key in enumerate(keys) if key in keys[:i]))
    return doc


def _parse(data: Any, corrupt: Corrupt) -> dict[str, Any]:
    """``data`` as a JSON object, read strictly: UTF-8, no duplicate keys, no NaN, within the size cap."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise corrupt(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_RECORD_BYTES:
        raise corrupt(f"object is larger than the {MAX_RECORD_BYTES // 1024} KiB limit for lock records")
    if not data.strip():
        raise corrupt("object is empty")
    try:
        orjson.loads(data)  # strict about syntax, UTF-8 and NaN; then read for the duplicates orjson lets pass
        doc = json.loads(data, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise corrupt(f"duplicate key {exc.args[0]!r}: readers could disagree on its value") from exc
    except orjson.JSONDecodeError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise corrupt("object is not valid UTF-8") from exc
        raise corrupt(f"invalid JSON ({exc})") from exc
    except Exception as exc:  # e.g. nesting too deep; still the record's fault
        raise corrupt(f"unreadable JSON ({type(exc).__name__}: {exc})") from exc
    if not isinstance(doc, dict):
        raise corrupt(f"expected a JSON object, got {_json_type(doc)}")
    return doc


def _check_extra(extra: dict[str, Any], corrupt: Corrupt) -> None:
    """Refuse unknown fields the lock could not write back unchanged.

    orjson reads 1024 levels of nesting but writes only 254, and a record near
    the cap would grow past it and become unreadable once rewritten.
    """
    if not extra:
        return
    try:
        size = len(json.dumps(extra, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
        if _depth(extra) > 250:
            raise ValueError("nested too deeply")
    except (ValueError, RecursionError) as exc:
        raise corrupt(f"unknown fields cannot be written back unchanged ({exc})") from exc
    if size > MAX_EXTRA_BYTES:
        raise corrupt(
            f"unknown fields take {size} bytes; at most {MAX_EXTRA_BYTES} are kept "
            "so the record still fits when written back"
        )


def _depth(value: Any, level: int = 0) -> int:
    """How deeply ``value`` nests (orjson writes at most 254 levels; we stay under that)."""
    if level > 260 or not isinstance(value, (dict, list)):
        return level
    return max(
        (_depth(v, level + 1) for v in (value.values() if isinstance(value, dict) else value)), default=level + 1
    )
