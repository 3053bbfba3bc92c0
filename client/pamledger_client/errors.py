"""PamspecError: the PAMSPEC error envelope as a client-side exception.

Apart from the client so the connection helpers and the CLI raise and render the same envelope.
"""

from __future__ import annotations

import uuid
from typing import Any

from pamledger_client.protocol.errors import RETRYABLE, ErrorCode


class PamspecError(Exception):
    """A PAMSPEC error envelope raised on the client side."""

    def __init__(self, code: str, message: str, retryable: bool, details: dict[str, Any] | None = None,
                 operation_id: str = "", policy_rule_id: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details = details or {}
        self.operation_id = operation_id
        self.policy_rule_id = policy_rule_id  # the rule that refused, on access_denied / policy_denied

    @classmethod
    def from_envelope(cls, env: dict[str, Any]) -> PamspecError:
        return cls(env["code"], env["message"], env["retryable"], env.get("details"), env.get("operation_id", ""),
                   env.get("policy_rule_id"))

    @classmethod
    def of(cls, code: ErrorCode, message: str, details: dict[str, Any] | None = None,
           policy_rule_id: str | None = None) -> PamspecError:
        """An error made on the client side, retryable as the code's row in the PAMSPEC table says; its
        operation id is minted here (no request reached the service), so the envelope is always whole."""
        return cls(code, message, RETRYABLE[code], details, f"op:{uuid.uuid4()}", policy_rule_id)

    def envelope(self) -> dict[str, Any]:
        """The PAMSPEC error envelope (what the service would have answered)."""
        envelope = {"code": self.code, "message": self.message, "retryable": self.retryable,
                    "operation_id": self.operation_id, "details": self.details}
        if self.policy_rule_id is not None:
            envelope["policy_rule_id"] = self.policy_rule_id
        return envelope
