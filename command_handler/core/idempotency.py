"""Is a command under a used idempotency key the same request as the first? (PAMSPEC 10.1: the same key and
the same request replay the original result; another request is duplicate_operation.) Pure."""

from __future__ import annotations

from command_handler.core.intake import Parsed
from command_handler.core.batch import ERASED_REQUEST
from schemas.commands import RegisterEmbeddingSpace
from schemas.errors import DuplicateOperation, InvalidRequest


def same_request(item: Parsed, digest: str) -> None:
    """Nothing when `item` is the request whose digest is recorded; else raise. After an erasure only the
    request's shape is compared (command_handler.store.ERASED_REQUEST); a space registration has its own
    answer for another descriptor."""
    if digest.startswith(ERASED_REQUEST + "."):  # the content was erased: compare the request's shape alone
        digest, asked = digest.partition(".")[2], item.request_digest.partition(".")[2]
        if digest == asked:
            return
        raise DuplicateOperation(
            "idempotency key was already used with a different request",
            details={"idempotency_key": item.idempotency_key, "scope_id": item.scope_id})
    if digest != item.request_digest and isinstance(item.command, RegisterEmbeddingSpace):
        raise InvalidRequest(
            "this embedding_space_id is already registered with another descriptor; a changed space needs a new id",
            details={"embedding_space_id": item.command.space.embedding_space_id, "registered_digest": digest,
                     "space_digest": item.request_digest},
        )
    if digest != item.request_digest:
        raise DuplicateOperation(
            "idempotency key was already used with a different request",
            details={"idempotency_key": item.idempotency_key, "scope_id": item.scope_id},
        )
