"""The lock record: one JSON object, decoded strictly because anyone with bucket access can write it.

Wire format (version 1)::

    {"version": 1,
     "ownerId": "host:pid:ab12", "expiresAt": 1700000060.0,
     "waitingOwnerId": null, "waiterExpiresAt": null,
     "ttl": 60.0, "token": 1700000000123, "nonce": "9f2c..."}

Three optional fields carry who exactly is waiting: ``waiterInstance`` (a
random id of the waiting lock instance, so two processes that share a stable
owner id are never confused), ``waiterTtl`` (the lease the waiter wants), and
``ownerInstance`` (the instance a handoff was made to). They are written only
when set.

Two more optional fields say who the owner and the waiter are, for people:
``ownerLabel`` and ``waiterLabel``, each ``{"text": "host=gpu-3 pid=4242
pod=ml/train-0", "instance": "<ownerInstance or waiterInstance>"}`` with an
optional ``"grace"`` (seconds the holder allows its work to stop once asked).
A label counts only while the instance it names still holds that place: a
writer that does not know labels keeps them as unknown fields, and when such a
writer takes the lock or the slot (writing its own instance, or none) the old
label stops counting instead of naming the wrong job. A label that is not of
that shape is corrupt, like any other field.

Two more, bound the same way to the places they speak of: ``waiterRequest``
(``{"asks": false, "priority": 0, "id": ..., "instance": ...}``: a patient
waiter, which waits without asking the holder to leave, and the rank its
request has for the single slot) and ``declinedWaiter`` (``{"id", "instance",
"owner", "ownerInstance"}``: the holder saw that waiter's request and declined
it). Each counts only while the waiter (and, for a decline, the owner) it
names is still the one in place; otherwise it reads as absent: a waiter
written by an older version asks, at priority 0, as that version's waiters do.

The first four fields are the original design's and the only required ones: a
record written by another implementation with just those four is read
correctly (``token`` 0, no ``ttl``, no ``nonce``). Unknown fields are kept and
written back unchanged. Anything else that is off raises
:class:`~handofflock.core.errors.LockRecordCorrupt` naming the object and the reason.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

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

_KNOWN = (
    "version",
    "ownerId",
    "expiresAt",
    "waitingOwnerId",
    "waiterExpiresAt",
    "ttl",
    "token",
    "nonce",
    "ownerInstance",
    "waiterTtl",
    "waiterInstance",
    "ownerLabel",
    "waiterLabel",
    "waiterRequest",
    "declinedWaiter",
)
_REQUIRED = ("ownerId", "expiresAt", "waitingOwnerId", "waiterExpiresAt")


def new_nonce() -> str:
    """A fresh nonce: 128 random bits, hex. Unique per write."""
    return os.urandom(16).hex()


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
        problem = label_problem(self.text, "label")
        if problem is None and self.grace is not None:
            g = self.grace
            if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or not 0 <= g <= MAX_TTL:
                problem = f"a label's grace must be a number of seconds in [0, {MAX_TTL:.0f}] (a week), got {g!r}"
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
class LockRecord:
    """What the lock object says. Immutable; derive changed copies with :meth:`replace`.

    ``extra`` holds fields this version does not know, preserved across writes.
    ``legacy`` is True when the record had no ``version`` field (written by the
    original four-field design).
    """

    owner_id: str | None = None
    expires_at: float | None = None
    waiting_owner_id: str | None = None
    waiter_expires_at: float | None = None
    ttl: float | None = None
    token: int = 0
    nonce: str | None = None
    owner_instance: str | None = None
    waiter_ttl: float | None = None
    waiter_instance: str | None = None
    version: int = RECORD_VERSION
    owner_label: Label | None = None
    waiter_label: Label | None = None
    waiter_request: WaiterRequest | None = None
    declined: bool = False  # the owner in place declined the request of the waiter in place
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    legacy: bool = field(default=False, compare=False)

    # -- reading the state ----------------------------------------------------

    def owner_live(self, now: float, skew: float = 0.0) -> bool:
        """Whether an owner holds an unexpired lease at ``now`` (with ``skew`` grace)."""
        return self.owner_id is not None and self.expires_at is not None and now <= self.expires_at + skew

    def waiter_live(self, now: float, skew: float = 0.0) -> bool:
        """Whether a waiter holds an unexpired slot at ``now`` (with ``skew`` grace)."""
        return (
            self.waiting_owner_id is not None
            and self.waiter_expires_at is not None
            and now <= self.waiter_expires_at + skew
        )

    @property
    def request(self) -> WaiterRequest:
        """What the waiter in place wants (:data:`ASKING` when the record does not say)."""
        return self.waiter_request or ASKING

    def replace(self, **changes: Any) -> LockRecord:
        """A copy with ``changes`` applied; always written as the current version."""
        changes.setdefault("version", RECORD_VERSION)
        changes.setdefault("legacy", False)
        return replace(self, **changes)

    # -- wire format ----------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "version": self.version,
            "ownerId": self.owner_id,
            "expiresAt": self.expires_at,
            "waitingOwnerId": self.waiting_owner_id,
            "waiterExpiresAt": self.waiter_expires_at,
            "ttl": self.ttl,
            "token": self.token,
            "nonce": self.nonce,
        }
        # Written only when set, so a record of the original design stays as it was.
        if self.owner_instance is not None:
            doc["ownerInstance"] = self.owner_instance
        if self.waiter_ttl is not None:
            doc["waiterTtl"] = self.waiter_ttl
        if self.waiter_instance is not None:
            doc["waiterInstance"] = self.waiter_instance
        if self.owner_label is not None and self.owner_id is not None:
            doc["ownerLabel"] = _label_json(self.owner_label, self.owner_instance, self.owner_id)
        if self.waiter_label is not None and self.waiting_owner_id is not None:
            doc["waiterLabel"] = _label_json(self.waiter_label, self.waiter_instance, self.waiting_owner_id)
        if self.waiter_request not in (None, ASKING) and self.waiting_owner_id is not None:
            assert self.waiter_request is not None
            doc["waiterRequest"] = {
                "asks": self.waiter_request.asks,
                "priority": self.waiter_request.priority,
                "id": self.waiting_owner_id,
                "instance": self.waiter_instance,
            }
        if self.declined and self.waiting_owner_id is not None and self.owner_id is not None:
            doc["declinedWaiter"] = {
                "id": self.waiting_owner_id,
                "instance": self.waiter_instance,
                "owner": self.owner_id,
                "ownerInstance": self.owner_instance,
            }
        for k, v in self.extra.items():
            if k not in doc:
                doc[k] = v
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

        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise corrupt(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > MAX_RECORD_BYTES:
            raise corrupt(f"object is larger than the {MAX_RECORD_BYTES // 1024} KiB limit for lock records")
        if not data.strip():
            raise corrupt("object is empty")
        try:
            orjson.loads(data)  # strict about syntax and UTF-8; then read for what orjson cannot check
            doc = json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
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

        missing = [k for k in _REQUIRED if k not in doc]
        if missing:
            raise corrupt(f"missing field(s) {', '.join(missing)}")

        legacy = "version" not in doc
        version = RECORD_VERSION if legacy else doc["version"]
        if not _is_int(version):
            raise corrupt(f"'version' must be an integer, got {_json_type(version)}")
        if version != RECORD_VERSION:
            raise corrupt(
                f"unsupported format version {version} (this handofflock reads version {RECORD_VERSION}); "
                "a newer handofflock may have written it: upgrade before touching this lock"
            )

        owner = _opt_id(doc["ownerId"], "ownerId", corrupt)
        expires = _opt_timestamp(doc["expiresAt"], "expiresAt", corrupt)
        waiter = _opt_id(doc["waitingOwnerId"], "waitingOwnerId", corrupt)
        waiter_expires = _opt_timestamp(doc["waiterExpiresAt"], "waiterExpiresAt", corrupt)
        if owner is not None and expires is None:
            raise corrupt("'ownerId' is set but 'expiresAt' is null")
        if waiter is not None and waiter_expires is None:
            raise corrupt("'waitingOwnerId' is set but 'waiterExpiresAt' is null")

        ttl = doc.get("ttl")
        if ttl is not None:
            if not _is_number(ttl) or not math.isfinite(ttl):
                raise corrupt(f"'ttl' must be a finite number, got {_json_type(ttl)}")
            if not 0 < ttl <= MAX_TTL:
                raise corrupt(f"'ttl' must be in (0, {MAX_TTL:.0f}] seconds, got {ttl}")
            ttl = float(ttl)

        token = doc.get("token", 0)
        if token is None:
            token = 0
        if not _is_int(token):
            raise corrupt(f"'token' must be an integer, got {_json_type(token)}")
        if not 0 <= token <= MAX_TOKEN:
            raise corrupt(f"'token' must be in [0, 2**63-1], got {token}")

        nonce = doc.get("nonce")
        if nonce is not None and (not isinstance(nonce, str) or not 0 < len(nonce) <= MAX_NONCE_LENGTH):
            raise corrupt(f"'nonce' must be a string of 1-{MAX_NONCE_LENGTH} characters")

        owner_instance = _opt_instance(doc.get("ownerInstance"), "ownerInstance", corrupt)
        waiter_instance = _opt_instance(doc.get("waiterInstance"), "waiterInstance", corrupt)
        waiter_ttl = doc.get("waiterTtl")
        if waiter_ttl is not None:
            if not _is_number(waiter_ttl) or not math.isfinite(waiter_ttl) or not 0 < waiter_ttl <= MAX_TTL:
                raise corrupt(
                    f"'waiterTtl' must be a number in (0, {MAX_TTL:.0f}] seconds, got {_json_type(waiter_ttl)}"
                )
            waiter_ttl = float(waiter_ttl)

        owner_label = _opt_label(doc.get("ownerLabel"), "ownerLabel", owner_instance, owner, corrupt)
        waiter_label = _opt_label(doc.get("waiterLabel"), "waiterLabel", waiter_instance, waiter, corrupt)
        waiter_request = _opt_request(doc.get("waiterRequest"), waiter_instance, waiter, corrupt)
        declined = _declined(doc.get("declinedWaiter"), (waiter, waiter_instance, owner, owner_instance), corrupt)

        extra = {k: v for k, v in doc.items() if k not in _KNOWN}
        if extra:
            # The lock writes unknown fields back unchanged, so they must survive that:
            # orjson reads 1024 levels of nesting but writes only 254, and a record
            # near the cap would grow past it and become unreadable once rewritten.
            try:
                extra_bytes = len(
                    json.dumps(extra, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
                )
                if _depth(extra) > 250:
                    raise ValueError("nested too deeply")
            except (ValueError, RecursionError) as exc:
                raise corrupt(f"unknown fields cannot be written back unchanged ({exc})") from exc
            if extra_bytes > MAX_EXTRA_BYTES:
                raise corrupt(
                    f"unknown fields take {extra_bytes} bytes; at most {MAX_EXTRA_BYTES} are kept "
                    "so the record still fits when written back"
                )
        return cls(
            owner,
            expires,
            waiter,
            waiter_expires,
            ttl,
            token,
            nonce,
            owner_instance,
            waiter_ttl,
            waiter_instance,
            version,
            owner_label,
            waiter_label,
            waiter_request,
            declined,
            extra,
            legacy,
        )


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return doc


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any, level: int = 0) -> int:
    """How deeply ``value`` nests (orjson writes at most 254 levels; we stay under that)."""
    if level > 260:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def id_problem(value: Any, name: str) -> str | None:
    """Why ``value`` cannot be an owner or writer id, or None if it can.

    The one rule for ids: the decoder applies it to what it reads, and the
    constructors to what they will write, so nothing writes a record that
    its own decoder would call corrupt.
    """
    if not isinstance(value, str):
        return f"'{name}' must be a string, got {_json_type(value)}"
    if not value or len(value) > MAX_ID_LENGTH:
        return f"'{name}' must be 1-{MAX_ID_LENGTH} characters long"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return f"'{name}' contains control characters"
    return None


def _opt_id(value: Any, name: str, corrupt: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise corrupt(f"'{name}' must be a string or null, got {_json_type(value)}")
    problem = id_problem(value, name)
    if problem is not None:
        raise corrupt(problem)
    return value


def label_problem(value: Any, name: str) -> str | None:
    """Why ``value`` cannot be a label's text, or None if it can (the decoder and constructors share it)."""
    if not isinstance(value, str):
        return f"'{name}' must be a string, got {_json_type(value)}"
    if not value or len(value) > MAX_LABEL_LENGTH:
        return f"'{name}' must be 1-{MAX_LABEL_LENGTH} characters long"
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in value):
        return f"'{name}' contains control characters"
    return None


def _label_json(label: Label, instance: str | None, holder: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"text": label.text, "instance": instance, "id": holder}
    if label.grace is not None:
        doc["grace"] = label.grace
    return doc


def _opt_label(value: Any, name: str, instance: str | None, holder: str | None, corrupt: Any) -> Label | None:
    """A label as read: checked strictly; None when absent, or when it names an instance no longer there."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise corrupt(f"'{name}' must be an object or null, got {_json_type(value)}")
    unknown = sorted(set(value) - {"text", "instance", "id", "grace"})
    if unknown or "text" not in value or "instance" not in value or "id" not in value:
        raise corrupt(
            f"'{name}' must have 'text', 'instance' and 'id' (and optionally 'grace'), got keys {sorted(value)}"
        )
    problem = label_problem(value["text"], f"{name}.text")
    if problem is not None:
        raise corrupt(problem)
    of = _opt_instance(value["instance"], f"{name}.instance", corrupt)
    written_for = value["id"]
    if written_for is not None and id_problem(written_for, f"{name}.id") is not None:
        raise corrupt(str(id_problem(written_for, f"{name}.id")))
    grace = value.get("grace")
    if grace is not None:
        if not _is_number(grace) or not math.isfinite(grace) or not 0 <= grace <= MAX_TTL:
            raise corrupt(f"'{name}.grace' must be a number in [0, {MAX_TTL:.0f}] seconds, got {_json_type(grace)}")
        grace = float(grace)
    if holder is None or of != instance or written_for != holder:
        # Written for an owner or waiter that has since been replaced by a writer that does not
        # know labels (it kept this one, and maybe the instance too, as unknown fields): it no
        # longer says who is there. The id it was written for must still be the one in place.
        return None
    return Label(value["text"], grace)


def _opt_request(value: Any, instance: str | None, holder: str | None, corrupt: Any) -> WaiterRequest | None:
    """``waiterRequest`` as read: checked strictly; None when absent or written for a waiter no longer there."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"asks", "priority", "id", "instance"}:
        raise corrupt("'waiterRequest' must be an object with exactly 'asks', 'priority', 'id' and 'instance'")
    if not isinstance(value["asks"], bool):
        raise corrupt(f"'waiterRequest.asks' must be true or false, got {_json_type(value['asks'])}")
    priority = value["priority"]
    if not _is_int(priority) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise corrupt(f"'waiterRequest.priority' must be an integer in [-2**31, 2**31-1], got {_json_type(priority)}")
    of = _opt_instance(value["instance"], "waiterRequest.instance", corrupt)
    written_for = _opt_id(value["id"], "waiterRequest.id", corrupt)
    if holder is None or of != instance or written_for != holder:
        return None  # an older writer replaced that waiter and kept this as an unknown field
    return WaiterRequest(value["asks"], priority)


def _declined(value: Any, now_in_place: tuple[str | None, str | None, str | None, str | None], corrupt: Any) -> bool:
    """``declinedWaiter`` as read: True only while the waiter and the owner it names are both still in place."""
    if value is None:
        return False
    if not isinstance(value, dict) or set(value) != {"id", "instance", "owner", "ownerInstance"}:
        raise corrupt("'declinedWaiter' must be an object with exactly 'id', 'instance', 'owner' and 'ownerInstance'")
    named = (
        _opt_id(value["id"], "declinedWaiter.id", corrupt),
        _opt_instance(value["instance"], "declinedWaiter.instance", corrupt),
        _opt_id(value["owner"], "declinedWaiter.owner", corrupt),
        _opt_instance(value["ownerInstance"], "declinedWaiter.ownerInstance", corrupt),
    )
    return named[0] is not None and named[2] is not None and named == now_in_place


def _opt_instance(value: Any, name: str, corrupt: Any) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_NONCE_LENGTH
        or not value.isascii()
        or not value.isalnum()
    ):
        raise corrupt(f"'{name}' must be 1-{MAX_NONCE_LENGTH} ASCII letters or digits, or null")
    return value


def _opt_timestamp(value: Any, name: str, corrupt: Any) -> float | None:
    if value is None:
        return None
    if not _is_number(value):
        raise corrupt(f"'{name}' must be a number or null, got {_json_type(value)}")
    if not math.isfinite(value):
        raise corrupt(f"'{name}' must be finite")
    if not 0 <= value <= MAX_TIMESTAMP:
        raise corrupt(f"'{name}' must be a Unix time between 0 and year 3000, got {value}")
    return float(value)
