"""The ledger's followers, each led by its own role: a new follower is an apply step and a line here.

Why its own module: the supervisor (which roles exist), the runtime (which roles run) and `status` (which
roles to ask) all read this one list.
"""

from __future__ import annotations

from indexer.step import INDEXER
from infra.follower import FollowerSpec
from projector.step import PROJECTOR

FOLLOWERS: tuple[FollowerSpec, ...] = (PROJECTOR, INDEXER)
