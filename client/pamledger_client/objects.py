"""The SDK's object-model commands beyond create/update/transition/delete: relate, redact, promote and
correct_provenance (PAMSPEC 10.5, 10.9, 10.10, 8.6), as a mixin of MemoryClient.

Each method takes the fields of its command struct (schemas/relationship.py `Relate`, schemas/redaction.py
`Redact`, schemas/commands.py `Promote` and `CorrectProvenance`) as typed arguments; an argument left at None
is not sent, so the service's default applies. Writes carry an idempotency key like every SDK write.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pamledger_client.types import WriteResult

Directionality = Literal["directed", "bidirectional", "undirected"]


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """The command body: every field that is not None."""
    return {name: value for name, value in fields.items() if value is not None}


class ObjectCommands:
    """relate / redact / promote / correct_provenance; the class using it supplies `_command`."""

    async def _write(self, name: str, body: dict[str, Any]) -> WriteResult:
        return cast(WriteResult, await self._command(name, body))

    async def _command(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def relate(self, scope_id: str, source_object_id: str, target_object_id: str, relationship_type: str,
                     actor: dict[str, Any], provenance: dict[str, Any], *,
                     directionality: Directionality = "directed", canonical_content: Any = None,
                     relationship_id: str | None = None, expected_version_id: str | None = None,
                     target_scope_id: str | None = None, policy_basis: str | None = None,
                     lifecycle_state: str | None = None, availability_state: str | None = None,
                     retention_state: str | None = None, validation_state: str | None = None,
                     observed_at: str | None = None, asserted_at: str | None = None,
                     valid_from: str | None = None, valid_until: str | None = None,
                     integrity: dict[str, Any] | None = None, idempotency_key: str | None = None,
                     operation_id: str | None = None) -> WriteResult:
        """Create a Relationship Object (or, with relationship_id and expected_version_id, its next version).
        The result names it `relationship_id`; its envelope follows relationship.schema.json. A target in
        another scope (`target_scope_id`) needs a `policy_basis` (else policy_denied)."""
        return await self._write("relate", _present({
            "scope_id": scope_id, "source_object_id": source_object_id, "target_object_id": target_object_id,
            "relationship_type": relationship_type, "directionality": directionality, "actor": actor,
            "provenance": provenance, "canonical_content": canonical_content, "relationship_id": relationship_id,
            "expected_version_id": expected_version_id, "target_scope_id": target_scope_id,
            "policy_basis": policy_basis, "lifecycle_state": lifecycle_state,
            "availability_state": availability_state, "retention_state": retention_state,
            "validation_state": validation_state, "observed_at": observed_at, "asserted_at": asserted_at,
            "valid_from": valid_from, "valid_until": valid_until, "integrity": integrity,
            "idempotency_key": idempotency_key, "operation_id": operation_id}))

    async def redact(self, scope_id: str, object_id: str, expected_version_id: str, actor: dict[str, Any],
                     provenance: dict[str, Any], policy_basis: str, *, pointers: list[str] | None = None,
                     erase: bool = True, idempotency_key: str | None = None,
                     operation_id: str | None = None) -> WriteResult:
        """Redact an object: all of its content (no `pointers`: availability `redacted`) or the values at these
        JSON Pointers (availability `partially_redacted`, the rest kept). `erase=False` suppresses instead of
        erasing: the content stays in content storage and a restoration transition can bring it back."""
        target: dict[str, Any] = {"erase": erase}
        if pointers is not None:
            target["pointers"] = pointers
        return await self._write("redact", _present({
            "scope_id": scope_id, "object_id": object_id, "expected_version_id": expected_version_id,
            "actor": actor, "provenance": provenance, "policy_basis": policy_basis, "redaction_target": target,
            "idempotency_key": idempotency_key, "operation_id": operation_id}))

    async def promote(self, scope_id: str, source_object_id: str, expected_version_id: str,
                      target_object_type: str, target_canonical_content: Any, actor: dict[str, Any],
                      provenance: dict[str, Any], *, target_object_id: str | None = None,
                      target_schema_id: str | None = None, target_lifecycle_state: str | None = None,
                      target_validation_state: str | None = None, relationship_id: str | None = None,
                      quality_signals: dict[str, Any] | None = None, idempotency_key: str | None = None,
                      operation_id: str | None = None) -> WriteResult:
        """Promote a working_memory object into a canonical type, atomically: the result is the new object's,
        plus `promotion` linking the source's superseded version and the `derived_from` relationship."""
        return await self._write("promote", _present({
            "scope_id": scope_id, "source_object_id": source_object_id, "expected_version_id": expected_version_id,
            "target_object_type": target_object_type, "target_canonical_content": target_canonical_content,
            "actor": actor, "provenance": provenance, "target_object_id": target_object_id,
            "target_schema_id": target_schema_id, "target_lifecycle_state": target_lifecycle_state,
            "target_validation_state": target_validation_state, "relationship_id": relationship_id,
            "quality_signals": quality_signals, "idempotency_key": idempotency_key, "operation_id": operation_id}))

    async def correct_provenance(self, scope_id: str, object_id: str, expected_version_id: str,
                                 actor: dict[str, Any], provenance: dict[str, Any], *,
                                 removed_fields: list[str] | None = None, policy_basis: str | None = None,
                                 idempotency_key: str | None = None, operation_id: str | None = None) -> WriteResult:
        """Write a new version whose provenance is `provenance` (`provenance_updated`). Every field of the current
        provenance the correction lacks must be listed in `removed_fields`, else invalid_request."""
        return await self._write("correct_provenance", _present({
            "scope_id": scope_id, "object_id": object_id, "expected_version_id": expected_version_id,
            "actor": actor, "provenance": provenance, "removed_fields": removed_fields,
            "policy_basis": policy_basis, "idempotency_key": idempotency_key, "operation_id": operation_id}))
