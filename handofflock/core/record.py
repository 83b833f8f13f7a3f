"""The lock record: one JSON object, decoded strictly because anyone with bucket access can write it.

Wire format (version 1)::

    {"version": 1,
     "ownerId": "host:pid:ab12", "expiresAt": 1700000060.0,
     "waitingOwnerId": null, "waiterExpiresAt": null,
     "ttl": 60.0, "token": 1700000000123, "nonce": "9f2c..."}

In memory the record is nested: the owner in place (a :class:`Holder`) and
the waiter in place (a :class:`Waiter`), each None when absent, beside the
lock's ``ttl``, fencing ``token`` and write ``nonce``. :meth:`LockRecord.to_json`
writes every key, and :meth:`LockRecord.decode` reads and checks each one.

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
from collections.abc import Callable
from dataclasses import dataclass, field
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
#: ``problem(value, name)``: why ``value`` cannot be the field ``name``, or None if it can.
Problem = Callable[[Any, str], "str | None"]


def new_nonce() -> str:
    """A fresh nonce: 128 random bits, hex. Unique per write."""
    return os.urandom(16).hex()


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


def _check(problem: Problem, value: Any, name: str, corrupt: Corrupt) -> Any:
    """``value``, or raise ``corrupt`` with why ``problem`` says it cannot be the field ``name``."""
    if (why := problem(value, name)) is not None:
        raise corrupt(why)
    return value


def _object(
    doc: dict[str, Any], name: str, corrupt: Corrupt, keys: dict[str, Problem], optional: str = "", listed: str = ""
) -> Any:
    """The field ``name`` of ``doc`` as an object with ``keys`` (but ``optional``) and no others, each checked in
    the order of ``keys``; None for null. ``listed``: the keys in the order a reason lists them (``keys`` if not
    given)."""
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise corrupt(f"'{name}' must be an object or null, got {_json_type(value)}")
    need = [key for key in listed.split() or keys if key != optional]
    if not set(need) <= value.keys() <= keys.keys():
        quoted = [f"'{key}'" for key in need]
        listing = ", ".join(quoted[:-1]) + " and " + quoted[-1]
        also = f" (and optionally '{optional}')" if optional else ""
        raise corrupt(f"'{name}' must have {listing}{also}, got keys {sorted(value)}")
    for key, problem in keys.items():
        _check(problem, value.get(key), f"{name}.{key}", corrupt)
    return value


def _names(obj: Any, place: tuple[str | None, str | None]) -> bool:
    """Whether the object ``obj`` (None: none) names ``place``, the id and instance of the owner or the waiter.

    A label, request or since counts only while the place it was written for is still the one in
    place: an older writer that replaced that owner or waiter kept it as an unknown field.
    """
    return obj is not None and place[0] is not None and (obj["id"], obj["instance"]) == place


def _label(obj: Any, place: tuple[str | None, str | None]) -> Label | None:
    if not _names(obj, place):
        return None
    return Label(obj["text"], None if obj.get("grace") is None else float(obj["grace"]))


def _label_json(label: Label | None, place: Holder | Waiter) -> dict[str, Any] | None:
    if label is None:
        return None
    grace = {} if label.grace is None else {"grace": label.grace}
    return {"text": label.text, "instance": place.instance, "id": place.id, **grace}


def _of_hold(
    doc: dict[str, Any], name: str, field: str, check: Problem, corrupt: Corrupt, token: int | None
) -> float | None:
    """The number of ``{field: number, "token": ...}``, about the hold whose token it names: None unless
    that is ``token``, the record's while it has an owner (None without one).

    An older writer that took the lock (a new token) kept it as an unknown field: it is not this hold's.
    """
    obj = _object(doc, name, corrupt, {field: check, "token": _token})
    if obj is not None and obj[field] is None:
        raise corrupt(f"'{name}.{field}' must be a number, got null")
    if obj is None or token is None or (obj["token"] or 0) != token:
        return None
    return float(obj[field])


def _declined_json(owner: Holder, waiter: Waiter) -> dict[str, Any]:
    """``declinedWaiter``: the owner in place declined the request of the waiter in place."""
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


@dataclass(frozen=True)
class Holder:
    """The owner in place: its id, when its lease ends (wall clock), its instance and its label."""

    id: str
    expires_at: float
    instance: str | None = None
    label: Label | None = None

    def live(self, now: float, skew: float = 0.0) -> bool:
        """Whether the lease is unexpired at ``now`` (with ``skew`` grace)."""
        return now <= self.expires_at + skew


@dataclass(frozen=True)
class Waiter:
    """The waiter in place: its id, when its slot ends, the lease it wants (``ttl``), who it is, what it asks."""

    id: str
    expires_at: float
    ttl: float | None = None
    instance: str | None = None
    label: Label | None = None
    request: WaiterRequest = ASKING
    #: When the acquire in this slot began waiting (its wall clock): at equal rank the older waiter has the slot.
    since: float | None = None

    def live(self, now: float, skew: float = 0.0) -> bool:
        """Whether the slot is unexpired at ``now`` (with ``skew`` grace)."""
        return now <= self.expires_at + skew


#: The JSON keys of each place's fields, in order: its id and expiry first, required while the place is filled.
_KEYS = {
    "owner": ("ownerId", "expiresAt", "ownerInstance", "ownerLabel"),
    "waiter": (
        "waitingOwnerId",
        "waiterExpiresAt",
        "waiterTtl",
        "waiterInstance",
        "waiterLabel",
        "waiterRequest",
        "waitingSince",
    ),
}
_KNOWN = frozenset(
    {"version", "ttl", "token", "heldSince", "minHold", "nonce", "declinedWaiter"}.union(*_KEYS.values())
)
_LABEL: dict[str, Problem] = {"text": label_problem, "grace": _grace, "id": _id, "instance": _instance}
_REQUEST: dict[str, Problem] = {"asks": _asks, "priority": _priority, "id": _id, "instance": _instance}
_SINCE: dict[str, Problem] = {"at": _when, "id": _id, "instance": _instance}
_REQUIRED = [key for keys in _KEYS.values() for key in keys[:2]]


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
    ttl: float | None = None
    token: int = 0
    #: When the current hold began (wall clock): the write that took the lock or handed it over; renewals keep it.
    held_since: float | None = None
    #: How long the holder keeps the lock before a waiter's request is acted on (from ``held_since``).
    min_hold: float | None = None
    nonce: str | None = None
    declined: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    legacy: bool = field(default=False, compare=False)

    def waiter_live(self, now: float, skew: float = 0.0) -> bool:
        """Whether a waiter holds an unexpired slot at ``now`` (with ``skew`` grace)."""
        return self.waiter is not None and self.waiter.live(now, skew)

    def replace(self, **changes: Any) -> LockRecord:
        """A copy with ``changes`` applied; always written as the current version."""
        for place, cls in (("owner", Holder), ("waiter", Waiter)):
            flat = {attr: changes.pop(name) for name, (p, attr) in _FLAT.items() if p == place and name in changes}
            if flat:
                current = getattr(self, place)
                values = {k: v for k, v in {**(vars(current) if current else {}), **flat}.items() if v is not None}
                changes[place] = cls(**values) if "id" in values else None
        # What was kept of a place while it was empty goes once the place is written.
        written = {key for place, keys in _KEYS.items() if place in changes for key in keys}
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
        owner, waiter, token = self.owner, self.waiter, self.token
        doc: dict[str, Any] = {
            "version": RECORD_VERSION,
            "ownerId": owner and owner.id,
            "expiresAt": owner and owner.expires_at,
            "waitingOwnerId": waiter and waiter.id,
            "waiterExpiresAt": waiter and waiter.expires_at,
            "ttl": self.ttl,
            "token": token,
            "nonce": self.nonce,
        }
        optional: dict[str, Any] = {}
        if owner is not None:
            optional.update(ownerInstance=owner.instance, ownerLabel=_label_json(owner.label, owner))
        if waiter is not None:
            request, place = waiter.request, {"id": waiter.id, "instance": waiter.instance}
            optional.update(
                waiterTtl=waiter.ttl,
                waiterInstance=waiter.instance,
                waiterLabel=_label_json(waiter.label, waiter),
                # Nothing is written for a request that only asks (what a waiter without one wants).
                waiterRequest=None
                if request == ASKING
                else {"asks": request.asks, "priority": request.priority, **place},
                waitingSince=None if waiter.since is None else {"at": waiter.since, **place},
            )
        optional.update(
            heldSince=None if self.held_since is None else {"at": self.held_since, "token": token},
            minHold=None if self.min_hold is None else {"seconds": self.min_hold, "token": token},
        )
        if self.declined and owner is not None and waiter is not None:
            optional["declinedWaiter"] = _declined_json(owner, waiter)
        doc.update({key: value for key, value in optional.items() if value is not None})
        empty = {key for place, keys in _KEYS.items() if getattr(self, place) is None for key in keys}
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
        version = _check(_must("an integer", _is_int), RECORD_VERSION if legacy else doc["version"], "version", corrupt)
        if version != RECORD_VERSION:
            raise corrupt(
                f"unsupported format version {version} (this handofflock reads version {RECORD_VERSION}); "
                "a newer handofflock may have written it: upgrade before touching this lock"
            )

        def read(key: str, problem: Problem, convert: Callable[[Any], Any] = lambda value: value) -> Any:
            value = _check(problem, doc.get(key), key, corrupt)
            return None if value is None else convert(value)

        kept: dict[str, Any] = {}  # the fields of an empty place, written back as they were

        def filled(place: str, *values: Any) -> bool:
            """Whether the place whose first fields were read as ``values`` is filled; if empty, keep them."""
            keys = _KEYS[place]
            if values[0] is None:
                kept.update({key: doc[key] for key, value in zip(keys, values, strict=False) if value is not None})
                return False
            if values[1] is None:
                raise corrupt(f"'{keys[0]}' is set but '{keys[1]}' is null")
            return True

        owner = waiter = None
        owner_id, expires_at = read("ownerId", _id), read("expiresAt", _timestamp, float)
        instance = read("ownerInstance", _instance)
        label = _object(doc, "ownerLabel", corrupt, _LABEL, "grace", "text instance id grace")
        if filled("owner", owner_id, expires_at, instance):
            owner = Holder(owner_id, expires_at, instance, _label(label, (owner_id, instance)))

        waiter_id, expires_at = read("waitingOwnerId", _id), read("waiterExpiresAt", _timestamp, float)
        ttl, instance = read("waiterTtl", _ttl, float), read("waiterInstance", _instance)
        label = _object(doc, "waiterLabel", corrupt, _LABEL, "grace", "text instance id grace")
        asks = _object(doc, "waiterRequest", corrupt, _REQUEST)
        since = _object(doc, "waitingSince", corrupt, _SINCE)
        if filled("waiter", waiter_id, expires_at, ttl, instance):
            slot = (waiter_id, instance)
            request = WaiterRequest(asks["asks"], asks["priority"]) if _names(asks, slot) else ASKING
            since = float(since["at"]) if _names(since, slot) else None
            waiter = Waiter(waiter_id, expires_at, ttl, instance, _label(label, slot), request, since)

        ttl, token = read("ttl", _ttl, float), read("token", _token) or 0
        hold = None if owner is None else token
        held_since = _of_hold(doc, "heldSince", "at", _timestamp, corrupt, hold)
        min_hold = _of_hold(doc, "minHold", "seconds", _grace, corrupt, hold)
        nonce = read("nonce", _nonce)
        # The decline counts only while it names the owner and the waiter in place.
        decline = _object(doc, "declinedWaiter", corrupt, _DECLINED)
        declined = owner is not None and waiter is not None and decline == _declined_json(owner, waiter)
        extra = {**{k: v for k, v in doc.items() if k not in _KNOWN}, **kept}
        _check_extra(extra, corrupt)
        return cls(owner, waiter, ttl, token, held_since, min_hold, nonce, declined, extra, legacy)


_FLAT = {name: tuple(view.path) for name, view in vars(LockRecord).items() if isinstance(view, Forward)}
_DECLINED: dict[str, Problem] = {"id": _id, "instance": _instance, "owner": _id, "ownerInstance": _instance}


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
