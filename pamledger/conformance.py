"""PAMSPEC conformance harness subprocess protocol v1 over stdin/stdout, against the running service.

The harness writes one JSON request per line and reads one JSON response per line; stdout carries only
protocol lines (logs go to stderr). Requests are handled one at a time, in order. The harness cannot
provision scopes, so the first mention of a scope creates it (create_scope is idempotent).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import sys
from typing import Any, TextIO, cast

import structlog

from infra.endpoints import resolve
from infra.settings import Settings
from schemas.common import DIMENSION_STATES
from schemas.profiles import CLAIMED_PROFILES
from pamledger_client.client import MemoryClient, PamspecError
from pamledger.conformance_actors import ActorClients
from pamledger.conformance_delegation import DelegationOperations

log = structlog.get_logger(__name__)
PROTOCOL_VERSION = 1
_WRITE = frozenset({"scope_id", "object_id", "expected_version_id", "actor", "provenance"})
# operation -> (required argument names, optional argument names)
OPERATIONS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "create": (frozenset({"scope_id", "object_type", "canonical_content", "actor", "provenance"}),
               frozenset({"object_id", "lifecycle_state", "availability_state", "retention_state",
                          "validation_state", "idempotency_key"})),
    "read": (frozenset({"scope_id", "object_id"}), frozenset({"version_id"})),
    "update": (_WRITE | {"canonical_content"}, frozenset()),
    "transition": (_WRITE | {"dimension", "target_state"}, frozenset({"policy_basis", "policy_override"})),
    "delete": (_WRITE, frozenset({"policy_basis"})),
    "relate": (frozenset({"scope_id", "source_object_id", "target_object_id", "relationship_type", "directionality",
                          "actor", "provenance"}),
               frozenset({"relationship_id", "expected_version_id", "target_scope_id", "canonical_content",
                          "policy_basis", "idempotency_key"})),
    "redact": (_WRITE | {"policy_basis", "redaction_target"}, frozenset()),
    "promote": (frozenset({"scope_id", "source_object_id", "expected_version_id", "target_object_type",
                           "target_canonical_content", "actor", "provenance"}),
                frozenset({"target_object_id", "target_lifecycle_state", "target_validation_state",
                           "idempotency_key"})),
    "query": (frozenset({"scope_id"}),
              frozenset({"object_type", "lifecycle_state", "availability_state", "validation_state", "limit"})),
    "history": (frozenset({"scope_id", "object_id"}), frozenset()),
    "subscribe": (frozenset({"scope_id", "actor", "filter_spec"}), frozenset({"after_sequence"})),
    "poll_subscription": (frozenset({"subscription_id"}), frozenset({"max_events"})),
    "close_subscription": (frozenset({"subscription_id"}), frozenset({"reason"})),
    "grant_delegation": (frozenset({"scope_id", "granting_actor", "delegated_actor", "granted_operations",
                                    "policy_basis", "not_before", "not_after"}),
                         frozenset({"usage_limit", "granted_object_ids", "granted_object_types"})),
    "check_delegation": (frozenset({"delegation_id", "scope_id", "delegated_actor_id", "operation"}),
                         frozenset({"object_id"})),
    "revoke_delegation": (frozenset({"delegation_id"}), frozenset()),
}
SUBSCRIPTION_OPERATIONS = frozenset({"subscribe", "poll_subscription", "close_subscription"})
DELEGATION_OPERATIONS = frozenset({"grant_delegation", "check_delegation", "revoke_delegation"})
QUERY_DEFAULTS: dict[str, Any] = {"object_type": None, "lifecycle_state": "active",
                                  "availability_state": "available", "validation_state": "corroborated",
                                  "limit": 50}
RESULT_KEYS = {"delete": ("object_id", "version_id", "envelope"),
               "relate": ("relationship_id", "version_id", "sequence", "envelope"),
               "promote": ("object_id", "version_id", "sequence", "envelope", "promotion")}
# Sent as the wire command itself: the redaction target is implementation-defined (PAMSPEC's MCP binding), so
# the service, not the adapter, judges every field of it (`{"pointers"?: [JSON Pointer], "erase"?: bool}`).
WIRE_OPERATIONS = frozenset({"redact"})
WRITE_RESULT_KEYS = ("object_id", "version_id", "sequence", "envelope")

class BadRequest(Exception):
    """A request the adapter cannot act on: answered with invalid_request."""

    def __init__(self, message: str, request_id: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.details = details or {}


def _version() -> str:
    try:
        return importlib.metadata.version("pamledger")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def hello() -> dict[str, Any]:
    version = _version()
    return {"type": "hello", "protocol_version": PROTOCOL_VERSION,
            "adapter": {"name": "pamledger-conformance-adapter", "version": version},
            "implementation": {"name": "pamledger", "version": version},
            "profiles_supported": list(CLAIMED_PROFILES)}


def error_line(request_id: str | None, code: str, message: str, retryable: bool,
               details: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": request_id,
            "error": {"code": code, "message": message, "retryable": retryable, "details": details}}


def parse_request(line: bytes) -> tuple[str, str, dict[str, Any]]:
    """(request_id, operation, arguments) with arguments checked against the operation's names."""
    try:
        request = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request line is not JSON: {exc}") from None
    if not isinstance(request, dict) or not isinstance(request.get("request_id"), str):
        raise BadRequest("request must be an object with a string request_id")
    request_id = request["request_id"]
    operation, arguments = request.get("operation"), request.get("arguments")
    if not isinstance(operation, str) or operation not in OPERATIONS:
        raise BadRequest(f"unknown operation {operation!r}", request_id, {"operations": sorted(OPERATIONS)})
    if not isinstance(arguments, dict):
        raise BadRequest("arguments must be a JSON object", request_id)
    return request_id, operation, check_arguments(operation, arguments, request_id)


def check_arguments(operation: str, arguments: dict[str, Any], request_id: str) -> dict[str, Any]:
    """Required names present, no unknown names; optional arguments given as null count as omitted."""
    required, optional = OPERATIONS[operation]
    missing, unknown = sorted(required - arguments.keys()), sorted(arguments.keys() - required - optional)
    if missing or unknown:
        raise BadRequest(f"bad arguments for {operation}", request_id, {"missing": missing, "unknown": unknown})
    if "scope_id" in required and not isinstance(arguments["scope_id"], str):
        raise BadRequest("scope_id must be a string", request_id, {"argument": "scope_id"})
    if operation == "query":
        return _query_arguments(arguments, request_id)
    return {k: v for k, v in arguments.items() if k in required or v is not None}


def _query_arguments(arguments: dict[str, Any], request_id: str) -> dict[str, Any]:
    merged = {**QUERY_DEFAULTS, **arguments}
    limit = merged["limit"]
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise BadRequest("limit must be a non-negative integer", request_id, {"argument": "limit"})
    for name in ("object_type", "lifecycle_state", "availability_state", "validation_state"):
        if merged[name] is not None and not isinstance(merged[name], str):
            raise BadRequest(f"{name} must be a string or null", request_id, {"argument": name})
    return merged


class ConformanceAdapter:
    """Turns harness operations into SDK calls (query included: the service's Query over the projection)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.client: MemoryClient | None = None
        self.scopes: set[str] = set()
        self.delegations = DelegationOperations()
        self.actors: ActorClients | None = None  # auth enforced: a client per harness actor
        self.subscribers: dict[str, MemoryClient] = {}

    async def handle(self, line: bytes) -> dict[str, Any]:
        request_id: str | None = None
        try:
            request_id, operation, arguments = parse_request(line)
            return {"request_id": request_id, "result": await self.call(operation, arguments)}
        except BadRequest as exc:
            return error_line(exc.request_id, "invalid_request", exc.message, False, exc.details)
        except PamspecError as exc:
            return error_line(request_id, exc.code, exc.message, exc.retryable, exc.details)
        except Exception as exc:  # noqa: BLE001 - never crash on one request
            log.exception("conformance.request_failed", error=type(exc).__name__)
            return error_line(request_id, "internal_error", f"adapter failure: {type(exc).__name__}", False, {})

    async def call(self, operation: str, arguments: dict[str, Any]) -> Any:
        client = await self._client()
        if operation in SUBSCRIPTION_OPERATIONS:
            return await self._subscription(client, operation, arguments)
        if operation in DELEGATION_OPERATIONS:
            return await self.delegations.call(client, operation, arguments, self._ensure_scope)
        await self._ensure_scope(client, arguments["scope_id"])
        target_scope = arguments.get("target_scope_id") if operation == "relate" else None
        if isinstance(target_scope, str):  # a cross-scope relationship's target scope is mentioned too
            await self._ensure_scope(client, target_scope)
        if "actor" in arguments and self.actors is not None:  # auth enforced: act as the harness's actor
            if isinstance(target_scope, str):  # relating into it needs read there
                await self.actors.client_for(arguments["actor"], target_scope)
            client = await self.actors.client_for(arguments["actor"], arguments["scope_id"])
        if operation == "query":
            return await self._query(client, arguments)
        if operation == "history":
            return (await client.history(**arguments))["versions"]
        if operation in WIRE_OPERATIONS:
            result = await client.command(operation, arguments)
        else:
            result = await getattr(client, operation)(**arguments)
        if operation == "read":
            return result
        return {key: result[key] for key in RESULT_KEYS.get(operation, WRITE_RESULT_KEYS)}

    async def _subscription(self, client: MemoryClient, operation: str, arguments: dict[str, Any]) -> Any:
        """Subscriptions over the harness are poll-mode: poll returns the next batch and acknowledges it."""
        if operation == "subscribe":
            await self._ensure_scope(client, arguments["scope_id"])
            if self.actors is not None:
                client = await self.actors.client_for(arguments["actor"], arguments["scope_id"])
            body = {"scope_id": arguments["scope_id"], "actor": arguments["actor"],
                    "filter": arguments["filter_spec"] or {}, "delivery": {"mode": "poll"}}
            if arguments.get("after_sequence") is not None:
                body["after_sequence"] = arguments["after_sequence"]
            opened = await client.subscription_request("open", body)
            self.subscribers[opened["subscription_id"]] = client  # polls and closes belong to the opener
            return {"subscription_id": opened["subscription_id"]}
        client = self.subscribers.get(arguments["subscription_id"], client)
        if operation == "poll_subscription":
            polled = await client.subscription_request("poll", {
                "subscription_id": arguments["subscription_id"], "max_events": arguments.get("max_events") or 100,
                "wait_ms": 500})
            # Each event carries its ledger_sequence, as the reference implementation's do: a harness
            # client resumes from it.
            return {"events": [{**item["event"], "ledger_sequence": item["ledger_sequence"]}
                               for item in polled["events"]]}
        await client.subscription_request("close", {"subscription_id": arguments["subscription_id"],
                                                    "reason": arguments.get("reason") or "unsubscribed"})
        return {}

    async def _client(self) -> MemoryClient:
        if self.client is None:
            timeout = self.settings.request_timeout_seconds
            try:
                url = resolve(self.settings).nats_url
                self.client = await asyncio.wait_for(
                    MemoryClient.connect(url, self.settings.subject_prefix, timeout), timeout)
            except Exception as exc:  # noqa: BLE001 - NoServers, refused, timeout: all mean unavailable
                log.warning("conformance.connect_failed", error=type(exc).__name__)
                raise PamspecError("service_unavailable", f"cannot reach the service: {type(exc).__name__}",
                                   True) from None
            self.client.retries = 0  # the harness owns retry policy
            if self.settings.auth.mode == "enforce":
                self.actors = ActorClients(self.client)
        return self.client

    async def _ensure_scope(self, client: MemoryClient, scope_id: str) -> None:
        if scope_id not in self.scopes:
            await client.create_scope(scope_id)
            self.scopes.add(scope_id)

    async def _query(self, client: MemoryClient, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """The service's Query; a null filter means any state, retention is not filtered (the harness
        names no retention), and results page through cursors up to `limit`."""
        body: dict[str, Any] = {"retention_states": list(DIMENSION_STATES["retention"]), "order": "newest"}
        if arguments["object_type"] is not None:
            body["object_types"] = [arguments["object_type"]]
        for dimension in ("lifecycle", "availability", "validation"):
            value = arguments[f"{dimension}_state"]
            body[f"{dimension}_states"] = [value] if value is not None else sorted(DIMENSION_STATES[dimension])
        # Read-your-writes across every client this adapter wrote with (one per harness actor, auth enforced).
        writers = [client, *(self.actors.clients.values() if self.actors is not None else ())]
        body["min_sequence"] = max(c.last_sequence for c in writers)
        envelopes: list[dict[str, Any]] = []
        while len(envelopes) < arguments["limit"]:
            page = await self._fresh_page(client, arguments["scope_id"], min(500, arguments["limit"] - len(envelopes)),
                                          body)
            envelopes += [item["envelope"] for item in page["items"]]
            if page["next_cursor"] is None:
                break
            body["cursor"] = page["next_cursor"]
        return envelopes

    @staticmethod
    async def _fresh_page(client: MemoryClient, scope_id: str, limit: int, body: dict[str, Any]) -> dict[str, Any]:
        """A page that reflects this adapter's own writes: Query waits up to its wait_ms for the projection and
        then answers as of where it is (min_sequence_reached false); the harness expects its writes, so ask
        again (up to ~60 s) rather than hand it a stale page."""
        for _ in range(30):
            page = cast(dict[str, Any], await client.query(scope_id, limit=limit, **body))
            if page.get("min_sequence_reached", True):
                return page
        return page

    async def close(self) -> None:
        if self.actors is not None:
            await self.actors.close()
        if self.client is not None:
            await self.client.close()


def _emit(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message, separators=(",", ":")) + "\n")  # ASCII: safe under any locale
    out.flush()


async def _serve(settings: Settings, out: TextIO) -> int:
    _emit(out, hello())
    adapter = ConformanceAdapter(settings)
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.buffer.readline):
            if line.strip():
                _emit(out, await adapter.handle(line))
    finally:
        await adapter.close()
    return 0


def run_adapter(settings: Settings) -> int:
    """Speak the harness protocol until stdin closes; exit status 0."""
    out, sys.stdout = sys.stdout, sys.stderr  # anything printed by accident lands on stderr
    try:
        return asyncio.run(_serve(settings, out))
    finally:
        sys.stdout = out
