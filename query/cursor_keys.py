"""The keys that sign query cursors: a small JSON file in the state dir, rotated with a grace period.

Why signed: a cursor carries the last row's sort key and a pinned sequence back to the service. Unsigned, a
client could forge one (any key values of the right types) or replay another caller's; signed with a key only
the service holds and bound to the caller that received it, a cursor is only ever the one the service gave
that caller (query.cursor).

The file (`query.cursor_keys`, default `<state_dir>/cursor-keys.json`, mode 0600) holds every key with its
creation and retirement times; the newest unretired key signs. `pamledger cursor-keys rotate` retires it and
adds a new one: cursors signed with a retired key are accepted for `query.cursor_key_grace_seconds` after its
retirement (a client paging through a long query is not cut off by a rotation), then refused, and the key is
dropped from the file at the next rotation. A query process re-reads the file when it changed (another process
rotated), looking at most once a second. Query processes on several machines need the same
file (a shared state dir, or a copy after each rotation).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import msgspec

from infra.settings import Settings

CURSOR_KEYS_NAME = "cursor-keys.json"  # in the state dir unless `query.cursor_keys` names another file
KEY_BYTES = 32
MAC_BYTES = 16  # HMAC-SHA256 cut to 128 bits: forging one is 2^128 guesses
RELOAD_SECONDS = 1.0


class CursorKey(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    secret: str  # hex
    created_at: float  # epoch seconds
    retired_at: float | None = None


class KeyFile(msgspec.Struct, kw_only=True):
    keys: list[CursorKey]


def _now() -> float:
    return time.time()


def _new_key(now: float) -> CursorKey:
    return CursorKey(id=f"k{secrets.token_hex(4)}", secret=secrets.token_hex(KEY_BYTES), created_at=now)


def _write(path: Path, keys: list[CursorKey]) -> None:
    """Atomically, owner-only: a rotation never leaves a half-written file for a reader."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(KeyFile(keys=keys)))
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def _read(path: Path) -> list[CursorKey]:
    found = msgspec.json.decode(path.read_bytes(), type=KeyFile).keys
    if not any(k.retired_at is None for k in found):
        raise ValueError(f"{path}: no current cursor key (every key is retired)")
    return found


def load_keys(path: Path) -> list[CursorKey]:
    """The file's keys, made (one new key) when the file does not exist yet. Made whole beside it and linked
    into place, so two processes starting at once agree on one key and neither reads a half-written file."""
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.{secrets.token_hex(4)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(KeyFile(keys=[_new_key(_now())])))
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(partial, path)  # fails when another process made the file first: its key is the one
    except FileExistsError:
        pass
    finally:
        partial.unlink()
    return _read(path)


def rotate(path: Path, grace_seconds: float, now: float | None = None) -> tuple[CursorKey, list[CursorKey]]:
    """Retire the current key, add a new one, drop keys retired longer than the grace period ago; returns the
    new key and the keys the file now holds."""
    now = _now() if now is None else now
    kept = [k if k.retired_at is not None else msgspec.structs.replace(k, retired_at=now) for k in load_keys(path)]
    kept = [k for k in kept if k.retired_at is None or k.retired_at + grace_seconds > now]
    new = _new_key(now)
    _write(path, [*kept, new])
    return new, [*kept, new]


def cursor_keys_path(settings: Settings) -> Path:
    """The file of the keys: the `query.cursor_keys` setting, else the state dir's."""
    return settings.query.cursor_keys or settings.state_dir / CURSOR_KEYS_NAME


def caller_tag(actor_id: str, delegation_id: str | None) -> str:
    """Who a cursor is bound to: the caller's actor and the delegation it read under (hashed: a cursor shows
    no ids)."""
    text = f"pamledger-cursor-caller\x00{actor_id}\x00{delegation_id or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class CursorSigner:
    """Signs with the current key; verifies with any key not retired longer than the grace period ago."""

    path: Path | None  # None: one key made now and held in memory only (cursors die with the process)
    grace_seconds: float
    keys: dict[str, CursorKey] = field(default_factory=dict)
    current: CursorKey | None = None
    _loaded_at: float = 0.0

    def __post_init__(self) -> None:
        self._load()

    _seen: int | None = None  # the file's mtime (ns) when last read

    def _load(self) -> None:
        found = load_keys(self.path) if self.path is not None else list(self.keys.values()) or [_new_key(_now())]
        self.keys = {k.id: k for k in found}
        self.current = max((k for k in found if k.retired_at is None), key=lambda k: k.created_at)
        self._loaded_at = time.monotonic()
        self._seen = self._mtime()

    def _mtime(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns if self.path is not None else None
        except OSError:
            return None

    def _refresh(self) -> None:
        """Re-read the file when another process rotated it (looked at most once a second): a retired key's
        grace then runs in this process too, and a dropped key is refused."""
        if self.path is None or time.monotonic() - self._loaded_at < RELOAD_SECONDS:
            return
        self._loaded_at = time.monotonic()
        if self._mtime() != self._seen:
            self._load()

    def sign(self, body: bytes) -> str:
        """`<key id>.<mac>` for the body."""
        self._refresh()
        assert self.current is not None
        return f"{self.current.id}.{_mac(self.current, body)}"

    def verify(self, key_id: str, body: bytes, mac: str, now: float | None = None) -> bool:
        self._refresh()
        key = self.keys.get(key_id)
        if key is None:
            return False
        now = _now() if now is None else now
        if key.retired_at is not None and key.retired_at + self.grace_seconds <= now:
            return False
        return hmac.compare_digest(_mac(key, body), mac)


def _mac(key: CursorKey, body: bytes) -> str:
    digest = hmac.new(bytes.fromhex(key.secret), body, hashlib.sha256).digest()[:MAC_BYTES]
    return digest.hex()


def describe(keys: list[CursorKey]) -> list[dict[str, object]]:
    """The keys without their secrets, for the CLI."""
    def when(t: float | None) -> str | None:
        return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")
    return [{"id": k.id, "created_at": when(k.created_at), "retired_at": when(k.retired_at)} for k in keys]
