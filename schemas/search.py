"""The Search request: text or a vector, one Embedding Space, a mode, and Query's structured filters.

Why its own request and not a Query option: a search names a space and answers with scores, an index
identity and the index's freshness, none of which a Query has. The structured filters (and their trusted
defaults: active, available, retained, corroborated) are Query's own `Filters`, so both apply the same.

Every problem with the request itself is invalid_request, found before anything is read: neither or both of
text and vector, a vector in lexical mode, a zero vector, empty or whitespace text, text longer than the preprocessing
profile's MAX_CHARS (never cut silently), a non-finite vector component, a limit out of 1..MAX_LIMIT.
Problems that need the registry (an unknown space, a vector of the wrong length, a space this build cannot
embed text for) are found by query.semantic against the space rows.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.common import Id
from schemas.embedding import MAX_DIMENSIONS  # a vector longer than any space can be is refused at once
from schemas.errors import CommandRejected, ErrorCode, InvalidRequest
from schemas.queries import MAX_WAIT_MS, Filters, check_ranges, decode_request
from pamledger_client.protocol.vocabulary import MODES as MODES, SEARCH_MAX_LIMIT, SearchMode

Mode = SearchMode
MAX_LIMIT = SEARCH_MAX_LIMIT
# The preprocessing profile's MAX_CHARS (embedding.text_profile; a unit test keeps them equal): a
# query text the profile would cut is refused rather than searched for in part.
MAX_TEXT_CHARS = 4096
TIE_BREAK = ("score desc", "object_id asc", "version_id asc")


class EmbeddingSpaceMismatch(CommandRejected):
    """A vector or text that cannot belong to the named space (wrong length, or no embedder for it here)."""

    code: ErrorCode = "embedding_space_mismatch"


class SearchRequest(Filters, frozen=True, kw_only=True, forbid_unknown_fields=True):
    scope_id: Id
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT_CHARS)] | None = None
    vector: Annotated[list[float], msgspec.Meta(min_length=1, max_length=MAX_DIMENSIONS)] | None = None
    embedding_space_id: Id | None = None  # None: the default space
    mode: Mode = "hybrid"
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT)] = 10
    min_sequence: Annotated[int, msgspec.Meta(ge=0)] | None = None
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_WAIT_MS)] = 2000
    snapshot_id: Id | None = None  # search the sealed snapshot's members at its watermark (query.snapshot_search)
    operation_id: Annotated[str, msgspec.Meta(max_length=512)] | None = None


_decoder = msgspec.json.Decoder(SearchRequest)


def decode_search(data: bytes) -> SearchRequest:
    """Decode and check a search; every problem is invalid_request naming what is wrong.

    JSON has no NaN or Infinity and msgspec refuses a number beyond a double's range ("1e999"), so a
    non-finite vector cannot arrive; check_value refuses one anyway, so no other decoder can slip one in."""
    request = decode_request(_decoder, data, "search")
    check_ranges(request)
    check_inputs(request)
    if request.snapshot_id is not None and request.min_sequence is not None:
        raise InvalidRequest("a snapshot pins its own sequence: send snapshot_id or min_sequence, not both",
                             details={"field": "min_sequence"})
    return request


def check_inputs(request: SearchRequest) -> None:
    """Exactly one of text and vector; text that says something; no vector where only words can search."""
    if (request.text is None) == (request.vector is None):
        raise InvalidRequest("give exactly one of text and vector", details={"field": "text"})
    if request.text is not None and not request.text.strip():
        raise InvalidRequest("text is empty or whitespace", details={"field": "text"})
    if request.vector is not None and request.mode == "lexical":
        raise InvalidRequest("lexical search needs text, not a vector", details={"field": "vector", "mode": "lexical"})
    if request.vector is not None and not any(request.vector):
        raise InvalidRequest("a zero vector has no direction: no cosine similarity to rank by",
                             details={"field": "vector"})
