"""An export page's byte bound (query.export._Page) counts an entry's vector lines with its version and event
lines: an entry whose lines, vectors included, would take the page past PAGE_BYTES waits for the next page,
and the first entry always goes in. Why: with --vectors a page's reply must still fit a NATS message."""

from __future__ import annotations

from query.export import PAGE_BYTES, _Entry, _Page


def entry(seq: int, vector_bytes: int) -> _Entry:
    made = _Entry(seq, [b'{"kind":"version"}', b'{"kind":"event"}'], True, b"{}")
    if vector_bytes:
        made.lines.append(b"v" * vector_bytes)
        made.vectors = 1
    return made


def test_vector_lines_count_against_the_pages_byte_bound() -> None:
    page = _Page([])
    assert page.add(entry(1, PAGE_BYTES // 2))
    assert not page.add(entry(2, PAGE_BYTES // 2))  # its event and version alone would fit, not with its vector
    assert page.full and page.rows == 1 and page.vectors == 1 and page.versions == 1 and page.last == 1
    assert len(page.lines) == 3 and page.size <= PAGE_BYTES


def test_the_first_entry_goes_in_whatever_its_vectors_size() -> None:
    page = _Page([])
    assert page.add(entry(1, PAGE_BYTES * 2))
    assert page.rows == 1 and page.vectors == 1 and not page.full
    assert not page.add(entry(2, 0))
