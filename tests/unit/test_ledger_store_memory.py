"""The LedgerStore contract (tests/ledger_store_contract.py) on the in-memory store: no Postgres, milliseconds."""

from __future__ import annotations

from typing import ClassVar

import pytest

from command_handler.memory_store import InMemoryLedgerStore, StoreRefused
from tests.ledger_store_contract import LedgerStoreContract


class TestInMemoryLedgerStore(LedgerStoreContract):
    refusals: ClassVar[tuple[type[BaseException], ...]] = (StoreRefused,)

    @staticmethod
    def constraint(exc: BaseException) -> str | None:
        return exc.constraint if isinstance(exc, StoreRefused) else None

    @pytest.fixture
    def store(self) -> InMemoryLedgerStore:
        return InMemoryLedgerStore()
