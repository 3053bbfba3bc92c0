"""Query cursor keys (query.cursor_keys): made once, 0600, rotated with a grace period, and a cursor
(query.cursor) that verifies only with the service's key, for the caller it was given to."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import msgspec
import pytest

from query.cursor import decode_cursor, encode_cursor
from query.cursor_keys import CursorSigner, caller_tag, load_keys, rotate
from schemas.errors import InvalidRequest
from schemas.queries import decode_query

QUERY = decode_query(msgspec.json.encode({"scope_id": "workspace:k"}))
ALICE, BOB = caller_tag("actor:alice", None), caller_tag("actor:bob", None)


def with_cursor(cursor: str) -> object:
    return decode_query(msgspec.json.encode({"scope_id": "workspace:k", "cursor": cursor}))


def test_the_key_file_is_made_once_owner_only_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "cursor-keys.json"
    first = load_keys(path)
    assert len(first) == 1 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_keys(path) == first  # a second process reads the same key


def test_a_cursor_round_trips_for_its_caller_only(tmp_path: Path) -> None:
    signer = CursorSigner(tmp_path / "k.json", 60)
    cursor = encode_cursor(QUERY, [7, "mem:a", "ver:a"], 5, signer, ALICE)
    assert decode_cursor(with_cursor(cursor), signer, ALICE) == ([7, "mem:a", "ver:a"], 5)
    with pytest.raises(InvalidRequest, match="another caller"):
        decode_cursor(with_cursor(cursor), signer, BOB)
    assert caller_tag("actor:alice", "del:1") != ALICE  # under a delegation is another caller


def test_a_changed_body_or_another_services_key_is_refused(tmp_path: Path) -> None:
    signer = CursorSigner(tmp_path / "k.json", 60)
    cursor = encode_cursor(QUERY, [7, "mem:a", "ver:a"], None, signer, ALICE)
    body, key_id, mac = cursor.split(".")
    plain = msgspec.json.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    moved = base64.urlsafe_b64encode(msgspec.json.encode({**plain, "k": [1, "mem:a", "ver:a"]})).decode().rstrip("=")
    other = CursorSigner(tmp_path / "other.json", 60)
    for forged in (f"{moved}.{key_id}.{mac}", f"{body}.{key_id}.{'0' * len(mac)}", f"{body}.knope.{mac}", body,
                   encode_cursor(QUERY, [7, "mem:a", "ver:a"], None, other, ALICE), "a.b.c.d", "%%%.k.m"):
        with pytest.raises(InvalidRequest, match="not a pamledger query cursor"):
            decode_cursor(with_cursor(forged), signer, ALICE)


def test_a_rotated_key_is_accepted_for_the_grace_period_then_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    signer = CursorSigner(path, 100)
    old = encode_cursor(QUERY, [7, "mem:a", "ver:a"], None, signer, ALICE)
    new_key, held = rotate(path, 100, now=1_000.0)
    assert [k.retired_at for k in held] == [1_000.0, None] and held[-1] == new_key
    reader = CursorSigner(path, 100)  # a process that reads the rotated file
    assert reader.current == new_key
    body, key_id, mac = old.split(".")
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    assert reader.verify(key_id, raw, mac, now=1_099.0)
    assert not reader.verify(key_id, raw, mac, now=1_100.0)
    _, held = rotate(path, 100, now=2_000.0)  # the first key, retired past its grace, leaves the file
    assert key_id not in {k.id for k in held} and len(held) == 2


def test_a_process_picks_up_a_rotation_made_by_another(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    serving = CursorSigner(path, 100)
    rotate(path, 100)
    signer = CursorSigner(path, 100)  # the rotating process signs with the new key
    cursor = encode_cursor(QUERY, [1, "mem:a", "ver:a"], None, signer, ALICE)
    serving._loaded_at -= 5  # its last read was a while ago (re-reads at most once a second)
    assert decode_cursor(with_cursor(cursor), serving, ALICE)[0] == [1, "mem:a", "ver:a"]


def test_a_memory_only_signer_needs_no_file() -> None:
    signer = CursorSigner(None, 60)
    cursor = encode_cursor(QUERY, [1, "mem:a", "ver:a"], None, signer, ALICE)
    assert decode_cursor(with_cursor(cursor), signer, ALICE)[0] == [1, "mem:a", "ver:a"]


def test_processes_starting_at_once_agree_on_one_key(tmp_path: Path) -> None:
    import concurrent.futures

    path = tmp_path / "k.json"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda _: load_keys(path), range(32)))
    assert all(keys == found[0] for keys in found) and len(found[0]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["k.json"]  # no partial file left behind
