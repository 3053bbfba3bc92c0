"""A Mem0 export as the pamledger commands that import it: pure (no I/O, no clock), so it is tested without servers.

Why a plan first: the whole file is read and checked before the first write, so a malformed export writes
nothing; the plan is then sent through the SDK like any client's commands (pamledger.cli_mem0). Every
command carries an idempotency key made of the Mem0 ids, so running the same import again replays instead of
writing. The mapping is documented in docs/mem0.md; the shapes accepted are Mem0's own:

- `Memory.get_all()` / `MemoryClient.get_all()` output `{"results": [memory, ...], ...}`, or a bare list of
  memories (the platform's v1 listing);
- optionally, beside `results`, `"history"`: Mem0's `history(memory_id)` lists, either as one object
  `{memory_id: [entry, ...]}` or as one list of entries that each name their `memory_id`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import msgspec

from schemas.common import is_valid_id
from pamledger_client.protocol.values import BadValue, check_value

ObjectKind = Literal["claim", "observation"]
CommandName = Literal["create", "update", "delete"]

MAX_TEXT_CHARS = 65_536  # one memory's text; Mem0 memories are short extracted facts
MAX_ID_CHARS = 200  # a Mem0 id (memory, history entry) or user / agent / run id
MAX_EXTRA_BYTES = 131_072  # what a version keeps of Mem0's fields (metadata, input messages ...), encoded
MAX_PROBLEMS = 20  # problems listed in one refusal
IDENTITY_FIELDS = ("user_id", "agent_id", "run_id", "app_id")
TOP_LEVEL_FIELDS = frozenset({"results", "history", "count", "next", "previous", "total_memories", "relations"})
HISTORY_TEXT_FIELDS = ("old_memory", "new_memory")
EVENTS = ("ADD", "UPDATE", "DELETE")
_encoder = msgspec.json.Encoder()


class Mem0ExportRefused(Exception):
    """The file is not a Mem0 export this importer can map; `problems` name each memory and the reason."""

    def __init__(self, message: str, problems: list[dict[str, Any]]):
        super().__init__(message)
        self.message = message
        self.problems = problems


@dataclass(frozen=True)
class Mem0Options:
    """Where memories go and who writes them (docs/mem0.md, "Scopes")."""

    scope: str  # every memory no rule below places
    actor: Mapping[str, str]  # the importing actor: every command names it
    user_scope_prefix: str | None = None  # a memory with user_id U goes to PREFIX + U
    map_user: Mapping[str, str] = field(default_factory=dict)  # explicit user_id -> scope
    map_agent: Mapping[str, str] = field(default_factory=dict)
    map_run: Mapping[str, str] = field(default_factory=dict)
    object_type: ObjectKind = "claim"


@dataclass(frozen=True)
class Step:
    """One command of one memory; `body` lacks `expected_version_id`, which the previous step's result gives."""

    command: CommandName
    body: dict[str, Any]


@dataclass(frozen=True)
class MemoryPlan:
    memory_id: str  # the Mem0 id
    scope_id: str
    object_id: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class ImportPlan:
    shape: str  # which accepted shape the file had
    scopes: tuple[str, ...]
    memories: tuple[MemoryPlan, ...]
    warnings: tuple[str, ...] = ()

    @property
    def versions(self) -> int:
        return sum(len(m.steps) for m in self.memories)


def decode_export(data: bytes) -> Any:
    """The file's JSON value, or Mem0ExportRefused: not UTF-8 JSON, NaN/Infinity, lone surrogates, too deep."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise Mem0ExportRefused(f"not a JSON document: {exc}", [{"reason": f"not JSON: {exc}"}]) from None
    except RecursionError:
        raise Mem0ExportRefused("the JSON nests too deeply to read", [{"reason": "nests too deeply"}]) from None


def plan_import(document: Any, options: Mem0Options) -> ImportPlan:
    """Every command the import sends, for the whole document; Mem0ExportRefused names every memory that
    cannot be mapped (up to MAX_PROBLEMS) and nothing is planned."""
    shape, items, history, warnings = _shape(document)
    problems: list[dict[str, Any]] = []
    memories: list[MemoryPlan] = []
    listed: dict[str, Mapping[str, Any]] = {}
    for index, item in enumerate(items):
        try:
            memory_id = _memory_id(item, f"results[{index}]")
            if memory_id in listed:
                raise _Problem(f"memory id {memory_id!r} is listed twice", memory_id)
            listed[memory_id] = item
        except _Problem as problem:
            problems.append(problem.as_dict(index))
    for memory_id in [*listed, *(m for m in history if m not in listed)]:
        try:
            memories.append(_memory(memory_id, listed.get(memory_id), history.get(memory_id, []), options))
        except _Problem as problem:
            problems.append(problem.as_dict())
    if problems:
        first = problems[0]
        where = f"memory {first['memory_id']!r}" if first.get("memory_id") else first.get("where", "the file")
        raise Mem0ExportRefused(f"{where}: {first['reason']} ({len(problems)} problem(s); nothing was written)",
                                problems[:MAX_PROBLEMS])
    scopes = tuple(sorted({m.scope_id for m in memories} | {options.scope}))
    return ImportPlan(shape, scopes, tuple(memories), tuple(warnings))


class _Problem(Exception):
    def __init__(self, reason: str, memory_id: str | None = None, where: str | None = None):
        super().__init__(reason)
        self.reason, self.memory_id, self.where = reason, memory_id, where

    def as_dict(self, index: int | None = None) -> dict[str, Any]:
        found: dict[str, Any] = {"reason": self.reason}
        for name, value in (("memory_id", self.memory_id), ("where", self.where), ("index", index)):
            if value is not None:
                found[name] = value
        return found


def _refuse(reason: str) -> Mem0ExportRefused:
    return Mem0ExportRefused(f"not a Mem0 export pamledger can import: {reason} (docs/mem0.md lists the shapes)",
                             [{"reason": reason}])


def _shape(document: Any) -> tuple[str, list[Any], dict[str, list[Any]], list[str]]:
    """(shape name, memory items, history per memory id, warnings) of an accepted top-level shape."""
    if isinstance(document, list):
        return "memory list", document, {}, []
    if not isinstance(document, dict):
        raise _refuse(f"the top level is a JSON {type(document).__name__}, not an object or a list")
    if "results" not in document:
        raise _refuse("the top-level object has no 'results' list (Mem0's get_all output)")
    unknown = sorted(set(document) - TOP_LEVEL_FIELDS)
    if unknown:
        raise _refuse(f"unknown top-level field(s) {unknown}: refused rather than silently dropped")
    if not isinstance(document["results"], list):
        raise _refuse("'results' is not a list")
    warnings = []
    if document.get("next"):
        warnings.append("the file is one page of a paginated listing ('next' is set): only its memories import")
    if document.get("relations"):
        warnings.append("graph 'relations' are not imported (memories only)")
    history = _history(document.get("history"))
    shape = "get_all results with history" if history else "get_all results"
    return shape, document["results"], history, warnings


def _history(value: Any) -> dict[str, list[Any]]:
    """{memory_id: entries} from either history layout (docs/mem0.md, "History")."""
    if value is None:
        return {}
    if isinstance(value, dict):
        for memory_id, entries in value.items():
            if not isinstance(entries, list):
                raise _refuse(f"history of memory {memory_id!r} is not a list of entries")
        return {str(k): list(v) for k, v in value.items()}
    if not isinstance(value, list):
        raise _refuse("'history' is neither an object of lists nor a list of entries")
    grouped: dict[str, list[Any]] = {}
    for index, entry in enumerate(value):
        memory_id = entry.get("memory_id") if isinstance(entry, dict) else None
        if not isinstance(memory_id, str) or not memory_id:
            raise _refuse(f"history[{index}] names no memory_id")
        grouped.setdefault(memory_id, []).append(entry)
    return grouped


def _memory_id(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise _Problem(f"a memory is a JSON object, not {type(item).__name__}", where=where)
    memory_id = item.get("id")
    if not isinstance(memory_id, str) or not memory_id:
        raise _Problem("the memory has no string 'id'", where=where)
    if len(memory_id) > MAX_ID_CHARS or not is_valid_id(f"mem:mem0:{memory_id}"):
        raise _Problem(f"the Mem0 id has characters a PAMSPEC id cannot hold or is over {MAX_ID_CHARS} characters",
                       memory_id[:MAX_ID_CHARS])
    return memory_id


def _memory(memory_id: str, item: Mapping[str, Any] | None, entries: list[Any],
            options: Mem0Options) -> MemoryPlan:
    if item is None:  # only in the history (deleted, or listed in another file)
        _memory_id({"id": memory_id}, "history")
    identity = _identity(memory_id, item, entries)
    scope_id = _scope_of(memory_id, identity, options)
    kind = _kind(memory_id, item, options)
    versions = _versions(memory_id, item, entries)
    object_id = f"mem:mem0:{memory_id}"
    steps = []
    for number, (event, text, extra, when) in enumerate(versions, start=1):
        steps.append(_step(memory_id, number, scope_id, object_id, kind, event, text, identity, extra, when,
                           options))
    return MemoryPlan(memory_id, scope_id, object_id, tuple(steps))


def _identity(memory_id: str, item: Mapping[str, Any] | None, entries: list[Any]) -> dict[str, str]:
    """user_id / agent_id / run_id / app_id: the listed memory's, else the first history entry naming them."""
    found: dict[str, str] = {}
    for source in ([item] if item is not None else []) + [e for e in entries if isinstance(e, dict)]:
        for name in IDENTITY_FIELDS:
            value = source.get(name)
            if value is None or name in found:
                continue
            if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
                raise _Problem(f"{name} is not a string of 1 to {MAX_ID_CHARS} characters", memory_id)
            found[name] = value
    return found


def _scope_of(memory_id: str, identity: Mapping[str, str], options: Mem0Options) -> str:
    """The first rule that places the memory: --map-run, --map-agent, --map-user, --user-scope-prefix, --scope."""
    for name, mapping in (("run_id", options.map_run), ("agent_id", options.map_agent),
                          ("user_id", options.map_user)):
        if name in identity and identity[name] in mapping:
            return mapping[identity[name]]
    if options.user_scope_prefix is not None and "user_id" in identity:
        scope = options.user_scope_prefix + identity["user_id"]
        if not is_valid_id(scope):
            raise _Problem(f"user_id {identity['user_id']!r} makes {scope!r}, which is not a PAMSPEC scope id: "
                           "name its scope with --map-user", memory_id)
        return scope
    return options.scope


def _kind(memory_id: str, item: Mapping[str, Any] | None, options: Mem0Options) -> ObjectKind:
    """claim (Mem0's extracted facts: semantic memory), observation for procedural memories (episodic traces
    of an agent's run) or whatever metadata.pamspec_object_type names (the upstream PAMSPEC adapter's key)."""
    metadata = item.get("metadata") if item is not None else None
    if isinstance(metadata, dict):
        named = metadata.get("pamspec_object_type")
        if named in ("claim", "observation"):
            return named  # type: ignore[no-any-return]
        if metadata.get("memory_type") == "procedural_memory":
            return "observation"
    return options.object_type


Version = tuple[str, str | None, dict[str, Any], str | None]  # (event, text, Mem0 fields kept, Mem0 time)


def _versions(memory_id: str, item: Mapping[str, Any] | None, entries: list[Any]) -> list[Version]:
    """The versions, oldest first: one per history entry (ADD, UPDATE, DELETE), then the listed memory itself
    when its text differs from the last entry's (or there is no history)."""
    current = _current(memory_id, item) if item is not None else None
    versions: list[Version] = []
    for index, entry in enumerate(entries):
        versions.append(_entry_version(memory_id, index, entry, bool(versions), versions[-1][0] if versions else None))
    if versions and versions[-1][0] == "DELETE":
        if current is not None:
            raise _Problem("the memory is listed, but its history ends with DELETE", memory_id)
        return versions
    if current is None:
        return versions
    if versions and versions[-1][1] == current[1]:  # the listing is the last entry's state: one version, merged
        event, text, extra, when = versions[-1]
        versions[-1] = (event, text, {**current[2], "history_entry": extra["history_entry"]}, when or current[3])
        return versions
    if versions:  # the listing moved on since the last entry (or the history is partial)
        return [*versions, ("CURRENT", current[1], current[2], current[3])]
    return [("CURRENT", current[1], current[2], current[3])]


def _current(memory_id: str, item: Mapping[str, Any]) -> Version:
    text = _text(memory_id, item.get("memory"), "memory")
    kept = {k: v for k, v in item.items() if k != "memory"}
    when = _time(memory_id, item.get("updated_at"), "updated_at") or _time(memory_id, item.get("created_at"),
                                                                           "created_at")
    return ("CURRENT", text, kept, when)


def _entry_version(memory_id: str, index: int, entry: Any, started: bool, previous: str | None) -> Version:
    where = f"history entry {index}"
    if not isinstance(entry, dict):
        raise _Problem(f"{where} is not a JSON object", memory_id)
    event = entry.get("event")
    if event not in EVENTS:
        raise _Problem(f"{where} has event {event!r}; only ADD, UPDATE and DELETE are imported", memory_id)
    if entry.get("memory_id", memory_id) != memory_id:
        raise _Problem(f"{where} names memory_id {entry.get('memory_id')!r}", memory_id)
    if previous == "DELETE":
        raise _Problem(f"{where} ({event}) comes after the DELETE", memory_id)
    if (event == "ADD") == started:
        raise _Problem(f"{where}: the history must start with ADD, and only there", memory_id)
    history_id = entry.get("id")
    if history_id is not None and (not isinstance(history_id, str) or len(history_id) > MAX_ID_CHARS):
        raise _Problem(f"{where} has an id that is not a string of at most {MAX_ID_CHARS} characters", memory_id)
    text = None if event == "DELETE" else _text(memory_id, entry.get("new_memory"), f"{where} new_memory")
    stamp = entry.get("updated_at") if event != "ADD" and entry.get("updated_at") else entry.get("created_at")
    kept = {k: v for k, v in entry.items() if k not in HISTORY_TEXT_FIELDS}
    return (str(event), text, {"history_entry": kept}, _time(memory_id, stamp, f"{where} time"))


def _text(memory_id: str, value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _Problem(f"{what} is not a string", memory_id)
    if len(value) > MAX_TEXT_CHARS:
        raise _Problem(f"{what} has {len(value)} characters, over the {MAX_TEXT_CHARS} an import takes", memory_id)
    if "\x00" in value:
        raise _Problem(f"{what} holds a NUL character", memory_id)
    return value


def _time(memory_id: str, value: Any, what: str) -> str | None:
    """A Mem0 time as RFC 3339; one without a zone is read as UTC (docs/mem0.md); None when absent."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise _Problem(f"{what} is not a date-time string", memory_id)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _Problem(f"{what} {value!r} is not an ISO 8601 date-time", memory_id) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.isoformat()


def _step(memory_id: str, number: int, scope_id: str, object_id: str, kind: ObjectKind, event: str,
          text: str | None, identity: Mapping[str, str], extra: dict[str, Any], when: str | None,
          options: Mem0Options) -> Step:
    actor = dict(options.actor)
    provenance: dict[str, Any] = {
        "provenance_id": f"prov:mem0:{memory_id}:{number}", "actor": actor, "activity": f"mem0:{event.lower()}",
        "source_ref": f"mem0:memory:{memory_id}",
        "evidence_refs": [f"mem0:{name}={value}" for name, value in sorted(identity.items())]
        + _history_ref(extra)}
    if when is not None:
        provenance["observed_at"] = when
    base = {"scope_id": scope_id, "object_id": object_id, "actor": actor, "provenance": provenance,
            "idempotency_key": f"mem0:{memory_id}:{number}"}
    if event == "DELETE":
        return Step("delete", base)
    assert text is not None
    content = _content(memory_id, kind, text, {"id": memory_id, **identity, **extra})
    body = {**base, "canonical_content": content}
    if when is not None:
        body.update(observed_at=when, asserted_at=when)
    if number == 1:
        return Step("create", {**body, "object_type": kind})
    return Step("update", body)


def _history_ref(extra: Mapping[str, Any]) -> list[str]:
    entry = extra.get("history_entry")
    history_id = entry.get("id") if isinstance(entry, dict) else None
    return [f"mem0:history_id={history_id}"] if isinstance(history_id, str) else []


def _content(memory_id: str, kind: ObjectKind, text: str, mem0: dict[str, Any]) -> dict[str, Any]:
    """claim: {"statement", "mem0"}; observation: {"text", "mem0"}; `mem0` keeps Mem0's own fields as they were."""
    try:
        check_value(mem0, max_depth=60)
    except BadValue as exc:
        raise _Problem(f"Mem0 field {exc.path}: {exc.reason}", memory_id) from None
    size = len(_encoder.encode(mem0))
    if size > MAX_EXTRA_BYTES:
        raise _Problem(f"its Mem0 fields (metadata, input ...) take {size} bytes, over {MAX_EXTRA_BYTES}", memory_id)
    return {"statement" if kind == "claim" else "text": text, "mem0": mem0}
