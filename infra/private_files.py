"""Secrets and configurations in the state dir: written whole (aside, then moved or linked into place), mode
0600, and made once when several processes race for the same file (the first one written wins)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_private(path: Path, text: str, exclusive: bool = False) -> bool:
    """Write `text` to `path` (mode 0600) as one atomic replacement; False when it already held exactly that.
    `exclusive`: never replace an existing file (the first writer wins)."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, aside = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.close(fd)
        if exclusive:
            try:
                os.link(aside, path)
            except FileExistsError:
                return False
        else:
            os.replace(aside, path)
    finally:
        if os.path.exists(aside):
            os.unlink(aside)
    return True


def ensure_private(path: Path, make: Callable[[], str], read: Callable[[Path], str | None]) -> tuple[str, bool]:
    """The secret `read` finds in `path`, made with `make` (0600) when there is none: (secret, made_now)."""
    existing = read(path)
    if existing is not None:
        return existing, False
    made = make()
    write_private(path, made + "\n", exclusive=True)
    found = read(path)
    if found is None:
        raise RuntimeError(f"{path} exists but holds no usable secret; remove it to have a new one made")
    return found, found == made
