"""The writer's tail check and verify's pure core, on hand-made chains."""

from __future__ import annotations

from command_handler.core.chain import GENESIS_HASH, row_hash
from command_handler.core.batch import tail_problem
from command_handler.verify import verify_rows


def chain(n: int) -> list[tuple[int, bytes, bytes, bytes]]:
    rows, prev = [], GENESIS_HASH
    for seq in range(1, n + 1):
        event = b'{"n":%d}' % seq
        rows.append((seq, event, prev, row_hash(prev, seq, event)))
        prev = rows[-1][3]
    return rows


def test_an_intact_tail_has_no_problem_even_when_it_starts_mid_chain() -> None:
    assert tail_problem(chain(5)) is None
    assert tail_problem(chain(5)[2:]) is None
    assert tail_problem([]) is None


def test_an_edited_event_in_the_tail_is_named() -> None:
    rows = chain(5)
    rows[4] = (5, b'{"n":"forged"}', rows[4][2], rows[4][3])
    assert tail_problem(rows) == "ledger row 5: row_hash does not match the row's bytes"


def test_a_relinked_row_or_a_gap_is_named() -> None:
    rows = chain(5)
    forged = row_hash(bytes(32), 4, rows[3][1])
    rows[3] = (4, rows[3][1], bytes(32), forged)
    assert tail_problem(rows[1:]) == "ledger row 4: prev_hash does not match the previous row's hash"
    assert tail_problem(chain(5)[:2] + chain(5)[3:]) == "sequence gap before ledger row 4"


def test_verify_rows_names_the_check_that_failed() -> None:
    rows = chain(3)
    assert verify_rows(rows)["ok"]
    bad = verify_rows([rows[0], (2, b"{}", rows[1][2], rows[1][3]), rows[2]])
    assert (bad["ok"], bad["first_bad_sequence"], bad["check"]) == (False, 2, "ledger.row_hash")
