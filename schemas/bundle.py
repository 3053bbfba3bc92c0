"""The bundle format of `pamledger export` / `import`: JSON Lines, one canonical JSON object per line.

    {"kind": "header", "format": "pamledger-bundle", "format_version": 1, ...}   first line
    {"kind": "version", "ledger_sequence": N, "envelope": {...}, "salt": "..."}   a Memory / Relationship Version
    {"kind": "event", "ledger_sequence": N, "event": {...}}                      every ledger entry of the scope
    {"kind": "vector", "ledger_sequence": N, "embedding_space_id": ..., "vector": [...], ...}   with --vectors
    {"kind": "trailer", "counts": {...}, "sha256": "sha256:..."}                 last line

Entries come in ledger order; a version's line comes just before the event that commits it, with the same
`ledger_sequence`. A version's `envelope` is byte for byte what history returns (content null where erased
or hidden, the tombstone marker on a deletion); `salt` is there only where the bundle carries the content, so
the import can check the content against the event's salted digest. With `--vectors` (the header's
`vectors`), a version whose content the bundle shows is followed, after its event, by one vector line per
space holding a vector of that very version; erased, hidden or deleted versions have none. The trailer's
sha256 is over the bytes of every line before it, newlines included; it is the bundle's digest. Pure: no I/O (pamledger.bundle
reads and writes files; docs/protocol.md documents the format).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Literal, cast

import msgspec

from schemas.canonical import canonical_bytes, decode_json, salted_digest
from schemas.embedding import FLOAT4_MAX, EmbeddingSpace, space_digest
from schemas.errors import InvalidRequest
from schemas.events import Event

FORMAT = "pamledger-bundle"
FORMAT_VERSION = 1

# The entries an import replays as themselves: everything that is the scope's memory (its versions, and the
# event-only entries that record how memory was made). The others are the source service's operations — its
# subscriptions, delegations (a grant there is none here), index records, denials, earlier imports — kept in
# the bundle for audit, counted, and not replayed.
VERSION_EVENTS = frozenset({
    "object_created", "object_updated", "lifecycle_transitioned", "availability_transitioned",
    "retention_transitioned", "validation_transitioned", "object_deleted", "object_redacted",
    "provenance_updated", "relationship_created", "relationship_updated",
})
MEMORY_ENTRIES = frozenset({"tool_invoked", "tool_completed", "working_memory_promoted"})
REPLAYED = VERSION_EVENTS | MEMORY_ENTRIES
FIRST_VERSION_EVENTS = frozenset({"object_created", "relationship_created"})


class ScopeRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    scope_id: str
    scope_kind: str
    parent_scope_id: str | None = None
    policy: dict[str, Any] | None = None


class Header(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind", tag="header"):
    format: str
    format_version: int
    pamledger_version: str
    source_ledger_id: str
    scope: ScopeRecord
    watermark: int  # the ledger sequence the export reads up to (its source ledger's)
    exported_at: str
    embedding_spaces: list[dict[str, Any]] = []  # descriptors with their digests, as the source registered them
    vectors: bool = False


class VersionLine(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind", tag="version"):
    ledger_sequence: int
    envelope: dict[str, Any]
    salt: str | None = None


class EventLine(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind", tag="event"):
    ledger_sequence: int
    event: dict[str, Any]


def version_line(ledger_sequence: int, envelope: bytes, salt: str | None) -> bytes:
    """A version line's bytes (no newline) around an envelope's canonical bytes, as they are: the bytes
    canonical_bytes(VersionLine(...)) gives for the decoded envelope, without decoding it."""
    raw = cast(dict[str, Any], msgspec.Raw(envelope))
    return canonical_bytes(VersionLine(ledger_sequence=ledger_sequence, envelope=raw, salt=salt))


def event_line(ledger_sequence: int, event: bytes) -> bytes:
    """An event line's bytes (no newline) around the ledger entry's canonical bytes, as they are."""
    return canonical_bytes(EventLine(ledger_sequence=ledger_sequence, event=cast(dict[str, Any], msgspec.Raw(event))))


class VectorLine(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind", tag="vector"):
    """A vector of the version whose event line it follows (`--vectors`): the space it belongs to (named in
    the header with the same digest), the content it was made from, and its values (float4s, as stored)."""

    ledger_sequence: int
    embedding_space_id: str
    space_digest: str
    object_id: str
    version_id: str
    content_digest: str
    vector: list[float]


def vector_line(ledger_sequence: int, object_id: str, version_id: str, content_digest: str, space_id: str,
                descriptor_digest: str, stored: bytes) -> bytes:
    """A vector line's bytes (no newline) from a vector in pgvector's text form (a JSON array of its float4s):
    the values decoded as JSON and encoded canonically, as canonical_bytes(VectorLine(...)) does for a line
    decoded from JSON."""
    return canonical_bytes(VectorLine(ledger_sequence=ledger_sequence, embedding_space_id=space_id,
                                      space_digest=descriptor_digest, object_id=object_id, version_id=version_id,
                                      content_digest=content_digest, vector=decode_json(stored)))


class Trailer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind", tag="trailer"):
    counts: dict[str, int]
    sha256: str


Line = Header | VersionLine | EventLine | VectorLine | Trailer
decode_line = msgspec.json.Decoder(Line).decode
KINDS = ("header", "version", "event", "vector", "trailer")


class BundleDigest:
    """The running sha256 of a bundle's lines (the trailer's `sha256` once every line before it is in)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, line: bytes) -> None:
        self._hash.update(line)

    @property
    def value(self) -> str:
        return "sha256:" + self._hash.hexdigest()


def vector_refusal(line: VectorLine, shown: tuple[int, str, str, str] | None, spaces: dict[tuple[str, str], int],
                   seen: set[str]) -> str | None:
    """Why a vector line cannot stand where it is, or None: it follows the event of a version whose content the
    bundle shows (`shown`: its ledger_sequence, object_id, version_id, content digest) and names it; its space
    is one of the header's with the same digest (`spaces`: (id, digest) -> dimensions), once per version
    (`seen`); it has the space's dimensions, each value a finite float4."""
    if shown is None or (line.ledger_sequence, line.object_id, line.version_id, line.content_digest) != shown:
        return "a vector follows the event of the version it names, whose content the bundle shows"
    dimensions = spaces.get((line.embedding_space_id, line.space_digest))
    if dimensions is None:
        return f"the space {line.embedding_space_id!r} with this digest is not one the header names"
    if line.embedding_space_id in seen:
        return f"a second vector of this version in the space {line.embedding_space_id!r}"
    if len(line.vector) != dimensions:
        return f"a vector of {len(line.vector)} dimensions in a space of {dimensions}"
    if not all(math.isfinite(x) and abs(x) <= FLOAT4_MAX for x in line.vector):
        return "a vector value that is not a finite float4"
    return None


def header_spaces(header: Header) -> dict[tuple[str, str], int]:
    """(embedding_space_id, space_digest) -> dimensions of the spaces a header names (a descriptor whose
    digest is not its own names none)."""
    named: dict[tuple[str, str], int] = {}
    for item in header.embedding_spaces:
        try:
            space = msgspec.convert(item.get("embedding_space"), EmbeddingSpace)
        except msgspec.ValidationError:
            continue
        if item.get("space_digest") == space_digest(space):
            named[(space.embedding_space_id, space_digest(space))] = space.dimensions
    return named


def chunk_key(bundle_digest: str, chunk: int) -> str:
    """The idempotency key of an import's chunk: the same bundle's chunk is the same request, whoever sends it."""
    return f"import:{bundle_digest}:{chunk}"


def refused(line: int, reason: str, **details: Any) -> InvalidRequest:
    """A bundle refused before anything is written: the line (1-based) and the reason."""
    return InvalidRequest(f"bundle line {line}: {reason}", details={"line": line, "reason": reason, **details})


def remap_event(event: dict[str, Any], scope_map: dict[str, str]) -> dict[str, Any]:
    """The event with every scope id it carries mapped (the entry's, its envelope's and a relationship's
    target scope); ids not in the map stay as they are."""
    if not scope_map:
        return event
    out = {**event, "scope_id": scope_map.get(event["scope_id"], event["scope_id"])}
    payload = event.get("payload")
    if isinstance(payload, dict) and isinstance(payload.get("envelope"), dict):
        out["payload"] = {**payload, "envelope": remap_envelope(payload["envelope"], scope_map)}
    return out


def remap_envelope(envelope: dict[str, Any], scope_map: dict[str, str]) -> dict[str, Any]:
    """A version envelope with its scope and a relationship's target scope mapped."""
    out = dict(envelope)
    for name in ("scope_id", "target_scope_id"):
        if isinstance(out.get(name), str):
            out[name] = scope_map.get(out[name], out[name])
    return out


def envelope_meta(envelope: dict[str, Any]) -> dict[str, Any]:
    """A version envelope's metadata: the envelope without its content (what the version's event carries)."""
    return {k: v for k, v in envelope.items() if k != "canonical_content"}


def typed_event(event: dict[str, Any]) -> Any:
    """The entry's typed event (schemas.events.Event), or the reason it is none: not of its type, or carrying
    fields its type does not have (it must encode back to the very bytes it came as)."""
    try:
        typed = msgspec.convert(event, Event)
    except msgspec.ValidationError as exc:
        return f"the {event.get('event_type')} event does not match its type: {exc}"
    if canonical_bytes(typed) != canonical_bytes(event):
        return f"the {event.get('event_type')} event carries fields its type does not have"
    return typed


def envelope_agrees(envelope: dict[str, Any], event: Any) -> bool:
    """Whether a version's envelope (without its content) says what its typed event's envelope says."""
    meta = envelope_meta(envelope)
    stated = event.payload.envelope
    try:
        typed = msgspec.convert(meta, type(stated))
    except msgspec.ValidationError:
        return False
    # Equal as types, and nothing beside what the type has: the envelope is what the version store keeps.
    return bool(typed == stated and canonical_bytes(typed) == canonical_bytes(meta)
                and meta.get("version_id") == event.version_id and meta.get("sequence") == event.sequence)


def shown_content(envelope: dict[str, Any], salt: str, digest: str | None) -> bytes | None:
    """The content bytes of a version whose envelope shows its content with this salt, when they match the
    event's digest; None when they do not."""
    content = canonical_bytes(envelope.get("canonical_content"))
    return content if digest is not None and salted_digest(bytes.fromhex(salt), content) == digest else None


ImportVerdict = Literal["imported", "already_imported", "resumed"]
