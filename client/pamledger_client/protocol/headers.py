"""The NATS header names of the PAMSPEC binding (docs/protocol.md): every client sends these, the service reads them."""

from __future__ import annotations

AUTHORIZATION_HEADER = "Authorization"  # "Bearer <token>" on every command, read, query, search and subscription call
IDEMPOTENCY_HEADER = "Pam-Idempotency-Key"
OPERATION_HEADER = "Pam-Operation-Id"
ACTOR_HEADER = "Pam-Actor"  # JSON {actor_id, actor_kind}: who makes a read, query or subscription request
