"""Role names accepted by `pamledger run --roles` and `pamledger serve --roles`."""

from __future__ import annotations

import pytest

from infra.supervisor import ROLES, parse_roles


def test_all_means_every_role_in_a_fixed_order() -> None:
    assert parse_roles("all") == ROLES == ("writer", "query", "projector", "gateway")


def test_a_subset_keeps_the_canonical_order_and_ignores_blanks() -> None:
    assert parse_roles(" gateway, writer ,,") == ("writer", "gateway")


@pytest.mark.parametrize("text", ["", ",", "writer,indexer", "Writer"])
def test_unknown_or_empty_role_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="unknown role"):
        parse_roles(text)
