"""Ids and the commit clock for a command (the writer shell's job, never the core's)."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from command_handler.core.intake import Parsed
from command_handler.core.state import Stamp
from command_handler.core.tool_memory import TOOL_EVENTS
from schemas.commands import CreateObject, Promote
from schemas.relationship import Relate


def new_stamp(parsed: Parsed) -> Stamp:
    """Fresh ids and the commit clock for one command (the shell's job, never the core's). One read of
    the system's randomness gives the four version-4 UUIDs and the content salt."""
    command = parsed.command
    random = os.urandom(80)
    if isinstance(command, Relate):
        object_id = command.relationship_id or f"rel:{uuid4_text(random[:16])}"
    else:
        object_id = (command.target_object_id if isinstance(command, Promote) else getattr(command, "object_id", None)) \
            or f"mem:{uuid4_text(random[:16])}"
    spares = _SPARE_IDS.get(type(command), 0)
    if isinstance(command, CreateObject) and command.object_type in TOOL_EVENTS:
        spares = 3
    return Stamp(
        operation_id=parsed.operation_id or f"op:{uuid4_text(random[16:32])}",
        event_id=f"evt:{uuid4_text(random[32:48])}",
        version_id=f"ver:{uuid4_text(random[48:64])}",
        object_id=object_id,
        now=datetime.now(timezone.utc),
        salt=random[64:],
        spare=tuple(uuid4_text(chunk) for chunk in _chunks(os.urandom(16 * spares))) if spares else (),
    )


_SPARE_IDS: dict[type, int] = {Promote: 12}  # three ids (event, version, object) per further entry


def _chunks(data: bytes) -> list[bytes]:
    return [data[i:i + 16] for i in range(0, len(data), 16)]


_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))  # the version nibble and the variant bits
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant


def uuid4_text(random16: bytes) -> str:
    """str(uuid.UUID(bytes=random16, version=4)), at a third of its cost (it is four per command)."""
    h = ((int.from_bytes(random16, "big") & _UUID4_CLEAR) | _UUID4_SET).to_bytes(16, "big").hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
