"""Export a scope to a bundle file and import one, through the service (schemas.bundle is the format).

Export pages through `query.export` (needs read and inspect_history on the scope) and writes line by line:
memory stays flat whatever the scope's size. Import reads the file twice: first it checks all of it (every
line's shape and type, versions against their events, contents against their digests, the trailer's counts
and sha256), so a truncated, edited or foreign bundle is refused, naming the line, before anything is sent;
then it sends the entries in chunks to the writer (`import_entries`, an administrator's command), each
idempotent under `import:<bundle digest>:<chunk>`, so an interrupted import resumes and a repeated one
changes nothing and says so.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from pamledger_client.cli_common import installed_version
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from schemas.bundle import (
    FORMAT, FORMAT_VERSION, REPLAYED, VERSION_EVENTS, BundleDigest, EventLine, Header, ScopeRecord, Trailer,
    VectorLine, VersionLine, chunk_key, decode_line, envelope_agrees, header_spaces, refused, remap_envelope,
    remap_event, shown_content, typed_event, vector_refusal,
)
from schemas.canonical import canonical_bytes, decode_json
from schemas.common import timestamp_text
from schemas.errors import PamledgerError

Progress = Callable[[dict[str, Any]], None]
CHUNK_ENTRIES = 500
CHUNK_BYTES = 262_144  # a chunk stops growing past this; the writer takes commands up to 512 KiB
MAX_LINE_BYTES = 2 * 1024 * 1024
VECTOR_FIELDS = ("embedding_space_id", "space_digest", "vector")  # what an entry's vector takes of its line


class _Page(msgspec.Struct, frozen=True):
    """An export page (query.export) with its bundle lines left as the service rendered them."""

    lines: list[msgspec.Raw]
    versions: int
    events: int
    last_sequence: int
    more: bool
    vectors: int = 0


_page_decoder = msgspec.json.Decoder(_Page)


def _quiet(_: dict[str, Any]) -> None:
    pass


class _Ticker:
    """Progress at most every `every` seconds, and always at the end."""

    def __init__(self, progress: Progress, every: float = 1.0):
        self.progress, self.every, self.last = progress, every, 0.0

    def __call__(self, report: dict[str, Any], final: bool = False) -> None:
        now = time.monotonic()
        if final or now - self.last >= self.every:
            self.last = now
            self.progress(report)


async def export_bundle(client: MemoryClient, scope_id: str, out: BinaryIO, at_sequence: int | None = None,
                        progress: Progress = _quiet, page_limit: int = 2000, vectors: bool = False) -> dict[str, Any]:
    """Write the scope's bundle to `out`; returns the trailer's counts, the digest and the watermark. With
    `vectors`, each version whose content the bundle shows is followed by its vectors (schemas.bundle)."""
    head = await client.query_request("export", {"scope_id": scope_id, "part": "header",
                                                 **({"at_sequence": at_sequence} if at_sequence is not None else {})})
    watermark = int(head["watermark"])
    digest = BundleDigest()
    counts: Counter[str] = Counter()

    def write(line: Any) -> None:
        encoded = canonical_bytes(line) + b"\n"
        digest.add(encoded)
        out.write(encoded)
        counts["lines"] += 1

    write(Header(format=FORMAT, format_version=FORMAT_VERSION, pamledger_version=installed_version(),
                 source_ledger_id=head["source_ledger_id"], scope=msgspec.convert(head["scope"], ScopeRecord),
                 watermark=watermark, exported_at=timestamp_text(datetime.now(timezone.utc)),
                 embedding_spaces=head["embedding_spaces"], vectors=vectors))
    tick = _Ticker(progress)
    after, more = 0, True

    async def fetch(after: int) -> _Page:
        body = {"scope_id": scope_id, "part": "entries", "limit": page_limit, "at_sequence": watermark,
                "after_sequence": after, **({"vectors": True} if vectors else {})}
        return _page_decoder.decode(await client.query_raw("export", body))

    pending = asyncio.ensure_future(fetch(after))
    try:
        while more:
            page = await pending
            after, more = page.last_sequence, page.more
            if more:  # the next page is asked for before this one is written: the service works meanwhile
                pending = asyncio.ensure_future(fetch(after))
            block = b"\n".join(page.lines) + b"\n" if page.lines else b""
            digest.add(block)
            out.write(block)
            counts.update(lines=len(page.lines), versions=page.versions, events=page.events, vectors=page.vectors)
            tick({"exported_events": counts["events"], "ledger_sequence": after, "watermark": watermark})
    finally:
        pending.cancel()
    totals = {"versions": counts["versions"], "events": counts["events"], "vectors": counts["vectors"],
              "lines": counts["lines"]}
    out.write(canonical_bytes(Trailer(counts=totals, sha256=digest.value)) + b"\n")
    tick({"exported_events": counts["events"], "ledger_sequence": after, "watermark": watermark}, final=True)
    return {"scope_id": scope_id, "watermark": watermark, "source_ledger_id": head["source_ledger_id"],
            "counts": totals, "bundle_digest": digest.value}


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    """A bundle that passed every check: its header, its digest and counts, and what an import replays."""

    header: Header
    bundle_digest: str
    counts: dict[str, int]
    not_replayed: dict[str, int]  # by event type: the source's operations, kept for audit only


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's lines, each read at most MAX_LINE_BYTES + 1 at a time: a line without end costs no memory."""
    with path.open("rb") as handle:
        number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise refused(number, f"longer than {MAX_LINE_BYTES} bytes")
            yield number, raw


def check_bundle(path: Path, progress: Progress = _quiet) -> Checked:
    """Check the whole bundle; raises PamspecError (invalid_request) naming the first bad line and why."""
    try:
        return _check(path, progress)
    except PamledgerError as exc:
        raise PamspecError.of(exc.code, exc.message, exc.details) from None


def _check(path: Path, progress: Progress) -> Checked:
    digest = BundleDigest()
    counts: Counter[str] = Counter()
    not_replayed: Counter[str] = Counter()
    header: Header | None = None
    trailer: Trailer | None = None
    pending: VersionLine | None = None
    shown: tuple[int, str, str, str] | None = None  # the version whose vectors may follow (schemas.bundle)
    seen: set[str] = set()  # the spaces of its vectors so far
    spaces: dict[tuple[str, str], int] = {}
    last_sequence, number = 0, 0
    tick = _Ticker(progress)
    for number, raw in _lines(path):
        if trailer is not None:
            raise refused(number, "a line after the trailer")
        if not raw.endswith(b"\n"):
            raise refused(number, "the bundle ends inside a line (truncated)")
        try:
            line = decode_line(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if number == 1:
                raise refused(1, f"not a {FORMAT} bundle: {exc}") from None
            raise refused(number, f"not a bundle line: {exc}") from None
        if number == 1:
            if not isinstance(line, Header):
                raise refused(1, f"a {FORMAT} bundle starts with its header")
            if line.format != FORMAT:
                raise refused(1, f"format {line.format!r} is not {FORMAT!r}")
            if line.format_version != FORMAT_VERSION:
                raise refused(1, f"format version {line.format_version} is not supported (this one reads"
                                 f" {FORMAT_VERSION})")
            header, spaces = line, header_spaces(line)
        elif isinstance(line, Trailer):
            trailer = line
            continue
        elif isinstance(line, VectorLine):
            assert header is not None
            _check_vector(number, line, header, shown, spaces, seen)
            counts["vectors"] += 1
        else:
            assert header is not None
            _check_entry(number, line, header, pending, last_sequence, counts, not_replayed)
            shown = None
            if isinstance(line, VersionLine):
                pending = line
            elif isinstance(line, EventLine):
                shown, seen = _shown(pending, line), set()
                pending, last_sequence = None, line.ledger_sequence
        counts["lines"] += 1
        digest.add(raw)
        tick({"checked_lines": counts["lines"]})
    if header is None:
        raise refused(1, "the bundle is empty")
    if trailer is None:
        raise refused(number + 1, f"no trailer after line {number}: the bundle is truncated")
    stated = {"versions": counts["versions"], "events": counts["events"], "vectors": counts["vectors"],
              "lines": counts["lines"]}
    if trailer.counts != stated:
        raise refused(number, "the trailer's counts are not the bundle's", stated=trailer.counts, found=stated)
    if trailer.sha256 != digest.value:
        raise refused(number, "the bundle's sha256 is not the trailer's: it was changed after the export",
                      stated=trailer.sha256, found=digest.value)
    return Checked(header=header, bundle_digest=digest.value, counts=stated, not_replayed=dict(not_replayed))


def _check_entry(number: int, line: Any, header: Header, pending: VersionLine | None, last_sequence: int,
                 counts: Counter[str], not_replayed: Counter[str]) -> None:
    if isinstance(line, Header):
        raise refused(number, "a second header")
    if isinstance(line, VersionLine):
        if pending is not None:
            raise refused(number, "two versions in a row: a version's line is followed by its event's")
        counts["versions"] += 1
        return
    counts["events"] += 1
    if not last_sequence < line.ledger_sequence <= header.watermark:
        raise refused(number, f"ledger_sequence {line.ledger_sequence} is out of order (after {last_sequence},"
                              f" at most the watermark {header.watermark})")
    event = typed_event(line.event)
    if isinstance(event, str):
        raise refused(number, event)
    if event.scope_id != header.scope.scope_id:
        raise refused(number, f"an event of scope {event.scope_id!r} in a bundle of {header.scope.scope_id!r}")
    if event.event_type not in REPLAYED:
        not_replayed[event.event_type] += 1
    if event.event_type in VERSION_EVENTS:
        if pending is None or pending.ledger_sequence != line.ledger_sequence:
            raise refused(number, "a version's event without its version line just before it")
        if not envelope_agrees(pending.envelope, event):
            raise refused(number - 1, "the version's envelope does not agree with its event")
        if pending.salt is not None and shown_content(pending.envelope, pending.salt,
                                                      event.payload.content_digest) is None:
            raise refused(number - 1, "the version's content does not match its event's digest")
    elif pending is not None:
        raise refused(number - 1, "a version line before an entry that commits no version")


def _check_vector(number: int, line: VectorLine, header: Header, shown: tuple[int, str, str, str] | None,
                  spaces: dict[tuple[str, str], int], seen: set[str]) -> None:
    if not header.vectors:
        raise refused(number, "a vector in a bundle whose header says it carries none")
    reason = vector_refusal(line, shown, spaces, seen)
    if reason is not None:
        raise refused(number, reason)
    seen.add(line.embedding_space_id)


def _shown(pending: VersionLine | None, line: EventLine) -> tuple[int, str, str, str] | None:
    """The version an event line commits when the bundle shows its content (its line carries the salt, which
    _check_entry held against the event's digest): vectors of it may follow."""
    event = line.event
    if pending is None or pending.salt is None or pending.envelope.get("availability_state") == "deleted":
        return None
    payload = event.get("payload")
    digest = payload.get("content_digest") if isinstance(payload, dict) else None
    name, version_id = event.get("object_id"), event.get("version_id")
    if not (isinstance(name, str) and isinstance(version_id, str) and isinstance(digest, str)):
        return None
    return (line.ledger_sequence, name, version_id, digest)


async def import_bundle(client: MemoryClient, path: Path, actor: dict[str, Any], scope_id: str | None = None,
                        scope_map: dict[str, str] | None = None, progress: Progress = _quiet) -> dict[str, Any]:
    """Check the bundle, then replay it into `scope_id` (default: its own scope id, or what `scope_map` maps
    it to). Returns what was written, replayed from an earlier run, and left out. The bundle's vectors go with
    their entries; the writer hands to the indexer those of a space registered here with the same descriptor
    digest (`vectors.handed_over`) and leaves the others out: the indexer embeds those versions
    (`vectors.left_to_indexer`; both count the chunks written now, not those an earlier run wrote)."""
    checked = check_bundle(path, progress)
    header = checked.header
    source = header.scope.scope_id
    mapping = dict(scope_map or {})
    if scope_id is not None:
        mapping[source] = scope_id
    target = mapping.get(source, source)
    scope = header.scope
    counts = {**checked.counts, "replayed": checked.counts["events"] - sum(checked.not_replayed.values())}
    common: dict[str, Any] = {
        "scope_id": target, "actor": actor, "bundle_digest": checked.bundle_digest,
        "source_ledger_id": header.source_ledger_id, "source_scope_id": source, "watermark": header.watermark,
        "scope_kind": scope.scope_kind, "counts": counts,
        **({"parent_scope_id": mapping.get(scope.parent_scope_id, scope.parent_scope_id)}
           if scope.parent_scope_id else {}),
        **({"policy": scope.policy} if scope.policy is not None else {}),
        **({"scope_map": {a: b for a, b in mapping.items() if a != b}} if any(a != b for a, b in mapping.items())
           else {}),
    }
    written = replayed_chunks = chunk = sent = handed = left = 0
    tick = _Ticker(progress)
    for entries, final in _chunks(path, mapping, checked.bundle_digest):
        body = {**common, "chunk": chunk, "entries": entries, "final": final,
                "idempotency_key": chunk_key(checked.bundle_digest, chunk)}
        result = await client.command("import_entries", body)
        if result.get("idempotency_result") == "replayed_original_result":
            replayed_chunks += 1
        else:
            written += len(entries)
            handed += int(result.get("vectors_handed_over", 0))
            left += int(result.get("vectors_left", 0))
        sent += len(entries)
        chunk += 1
        tick({"imported_entries": sent, "of": counts["replayed"], "chunk": chunk}, final=final)
    verdict = "already_imported" if replayed_chunks == chunk else "resumed" if replayed_chunks else "imported"
    return {"result": verdict, "scope_id": target, "source_scope_id": source, "bundle_digest": checked.bundle_digest,
            "source_ledger_id": header.source_ledger_id, "chunks": chunk, "chunks_replayed": replayed_chunks,
            "entries_written": written, "counts": counts, "not_replayed": checked.not_replayed,
            "vectors": {"in_bundle": counts["vectors"], "handed_over": handed, "left_to_indexer": left},
            **({"scope_map": common["scope_map"]} if "scope_map" in common else {})}


def _chunks(path: Path, mapping: dict[str, str], bundle_digest: str) -> Iterator[tuple[list[dict[str, Any]], bool]]:
    """The replayed entries in chunks bounded in count and bytes; the last one is final (it may be empty). A
    version's vector lines go with its entry (`vectors`), which the chunk takes once they are read. The
    lines are hashed again: a file changed since the check fails before the final chunk is sent."""
    chunk: list[dict[str, Any]] = []
    size = 0
    pending: dict[str, Any] | None = None
    held: dict[str, Any] | None = None  # the last entry, waiting for its vectors
    digest = BundleDigest()
    for number, raw in _lines(path):
        line = decode_json(raw)
        kind = line.get("kind")
        if kind == "vector":
            digest.add(raw)
            if held is not None:
                held.setdefault("vectors", []).append({name: line[name] for name in VECTOR_FIELDS})
            continue
        if held is not None:
            encoded = len(canonical_bytes(held))
            if chunk and (len(chunk) >= CHUNK_ENTRIES or size + encoded > CHUNK_BYTES):
                yield chunk, False
                chunk, size = [], 0
            chunk.append(held)
            size += encoded
            held = None
        if kind == "trailer":
            if digest.value != bundle_digest:  # the file changed after it was checked: the record is never sent
                raise PamspecError.of("invalid_request", f"bundle line {number}: the file changed while it was"
                                      " imported; import it again", {"line": number, "reason": "changed"})
            break
        digest.add(raw)
        if kind == "version":
            pending = line
            continue
        if kind != "event" or line["event"].get("event_type") not in REPLAYED:
            pending = None
            continue
        held = {"event": remap_event(line["event"], mapping)}
        if pending is not None:
            held["envelope"] = remap_envelope(pending["envelope"], mapping)
            if pending.get("salt") is not None:
                held["salt"] = pending["salt"]
        pending = None
    yield chunk, True
