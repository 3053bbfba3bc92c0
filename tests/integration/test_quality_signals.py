"""Quality signals in Query and Search filters and orders: usable, deterministic, never above validation state.

Why: quality_signals are non-authoritative (PAMSPEC 8.7); a filter or order on them must only narrow or rank
what the state filters let through (a rejected object stays rejected however confident), ties must order the
same way every time (same query, same state, same bytes), and the order must be the one the index serves.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pamledger_client.protocol.subjects import query_subject
from pamledger_client.client import MemoryClient, PamspecError
from query.plan import build
from schemas.queries import QueryRequest
from tests.conftest import ACTOR, PROVENANCE, Env

pytestmark = pytest.mark.profile("PAMSPEC-Structured-Query")  # docs/implementation-report.md

SCOPE = "workspace:quality"
TRUSTED_AND_REJECTED = ["corroborated", "rejected"]


async def claim(client: MemoryClient, name: str, confidence: float | None, validation: str = "corroborated",
                **signals: float) -> dict[str, Any]:
    quality = {**({"assessed_confidence": confidence} if confidence is not None else {}), **signals}
    return await client.create(SCOPE, "claim", {"statement": name}, ACTOR, PROVENANCE, validation_state=validation,
                               **({"quality_signals": quality} if quality else {}))


@pytest.fixture(scope="module")
async def made(client: MemoryClient) -> dict[str, str]:
    """Ties on purpose: two objects at 0.7, two without any signal."""
    await client.create_scope(SCOPE)
    objects = {
        "low": await claim(client, "low", 0.2, staleness_score=0.9),
        "tie_a": await claim(client, "tie a", 0.7, staleness_score=0.1),
        "high": await claim(client, "high", 0.95, staleness_score=0.3),
        "none_a": await claim(client, "no signal a", None),
        "tie_b": await claim(client, "tie b", 0.7),
        "rejected": await claim(client, "rejected but sure", 1.0, validation="rejected"),
        "none_b": await claim(client, "no signal b", None),
    }
    return {name: result["object_id"] for name, result in objects.items()}


def ids(result: dict[str, Any]) -> list[str]:
    return [item["envelope"]["object_id"] for item in result["items"]]


def names(made: dict[str, str], result: dict[str, Any]) -> list[str]:
    by_id = {object_id: name for name, object_id in made.items()}
    return [by_id[object_id] for object_id in ids(result)]


async def test_a_confident_rejected_object_stays_rejected_and_filtered_out(client: MemoryClient,
                                                                           made: dict[str, str]) -> None:
    sure = await client.query(SCOPE, quality={"assessed_confidence": {"gte": 0.9}}, order="assessed_confidence_desc")
    assert names(made, sure) == ["high"]  # the default validation filter (corroborated) still applies
    both = await client.query(SCOPE, validation_states=TRUSTED_AND_REJECTED,
                              quality={"assessed_confidence": {"gte": 0.9}}, order="assessed_confidence_desc")
    assert names(made, both) == ["rejected", "high"]
    assert both["items"][0]["envelope"]["validation_state"] == "rejected"  # the signal changed nothing
    assert names(made, await client.query(SCOPE, validation_states=["corroborated"],
                                          order="assessed_confidence_desc"))[0] == "high"


async def test_order_by_confidence_breaks_ties_by_ledger_sequence_and_puts_missing_last(
        client: MemoryClient, made: dict[str, str]) -> None:
    desc = await client.query(SCOPE, order="assessed_confidence_desc")
    # 0.7 tie: tie_b was written after tie_a, so it comes first (ledger_sequence desc), as for every profile
    assert names(made, desc) == ["high", "tie_b", "tie_a", "low", "none_b", "none_a"]
    asc = await client.query(SCOPE, order="assessed_confidence_asc")
    assert names(made, asc) == ["low", "tie_a", "tie_b", "high", "none_a", "none_b"]


async def test_filters_on_several_signals_combine_and_bounds_are_inclusive(client: MemoryClient,
                                                                           made: dict[str, str]) -> None:
    window = {"assessed_confidence": {"gte": 0.7, "lte": 0.95}, "staleness_score": {"lte": 0.3}}
    assert names(made, await client.query(SCOPE, quality=window, order="assessed_confidence_desc")) == ["high", "tie_a"]
    stale_first = await client.query(SCOPE, quality={"staleness_score": {"gte": 0.0}}, order="staleness_score_desc")
    assert names(made, stale_first) == ["low", "high", "tie_a"]  # objects without the signal never match a range


async def test_paging_through_ties_gives_the_one_page_order(client: MemoryClient, made: dict[str, str]) -> None:
    whole = ids(await client.query(SCOPE, order="assessed_confidence_desc", limit=50))
    paged: list[str] = []
    cursor = None
    while True:
        page = await client.query(SCOPE, order="assessed_confidence_desc", limit=2,
                                  **({"cursor": cursor} if cursor else {}))
        paged += ids(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == whole and len(whole) == 6


async def test_the_same_quality_query_answers_the_same_bytes(service: Env, client: MemoryClient,
                                                             made: dict[str, str]) -> None:
    body = json.dumps({"scope_id": SCOPE, "order": "assessed_confidence_desc", "limit": 3,
                       "quality": {"assessed_confidence": {"gte": 0.1}},
                       "min_sequence": client.last_sequence}).encode()
    subject = query_subject(service.settings.subject_prefix, "query")
    first, second = [(await client.nc.request(subject, body, timeout=30)).data for _ in range(2)]
    assert first == second and b'"next_cursor":"' in first
    as_of = await client.query(SCOPE, order="assessed_confidence_desc", as_of_sequence=client.last_sequence)
    assert ids(as_of) == ids(await client.query(SCOPE, order="assessed_confidence_desc"))  # time travel agrees


@pytest.mark.parametrize("body", [
    {"quality": {"assessed_confidence": {"gte": 0.9, "lte": 0.1}}},
    {"quality": {"assessed_confidence": {"gte": 1.5}}},
    {"quality": {"charisma": {"gte": 0.1}}},
    {"quality": {"assessed_confidence": {"above": 0.1}}},
    {"order": "charisma_desc"},
])
async def test_bad_quality_filters_and_orders_are_invalid_request(client: MemoryClient, made: dict[str, str],
                                                                  body: dict[str, Any]) -> None:
    with pytest.raises(PamspecError) as err:
        await client.query(SCOPE, **body)
    assert err.value.code == "invalid_request"


async def test_a_cursor_with_a_forged_quality_key_is_invalid_request(client: MemoryClient, service: Env,
                                                                    made: dict[str, str]) -> None:
    """Re-signed with the module's own cursor key (a leaked key): the shape check behind the signature
    still keeps the forged key away from Postgres."""
    import base64

    from query.cursor_keys import CursorSigner

    page = await client.query(SCOPE, order="assessed_confidence_desc", limit=1)
    text = page["next_cursor"].split(".")[0]
    body = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    body["k"][0] = "0.5; DROP TABLE ledger"
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signer = CursorSigner(service.settings.query.cursor_keys, 60)
    forged = base64.urlsafe_b64encode(raw).decode().rstrip("=") + "." + signer.sign(raw)
    with pytest.raises(PamspecError) as err:
        await client.query(SCOPE, order="assessed_confidence_desc", limit=1, cursor=forged)
    assert err.value.code == "invalid_request" and "does not fit" in str(err.value)


async def test_the_confidence_order_is_the_one_the_index_serves(service: Env, made: dict[str, str]) -> None:
    """The plan's sort expression must equal the index's, or the index silently serves nothing."""
    statement, params = build(QueryRequest(scope_id=SCOPE, order="assessed_confidence_desc", limit=2), None, None)
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_sort = off")
        plan = "\n".join(str(row[0]) for row in await (await conn.execute(b"EXPLAIN " + statement.as_bytes(conn),
                                                                          params)).fetchall())
    assert "current_objects_confidence_idx" in plan, plan


async def test_lexical_search_takes_the_same_quality_filter(client: MemoryClient, made: dict[str, str]) -> None:
    found = await client.search(SCOPE, text="tie", mode="lexical",
                                filter={"quality": {"assessed_confidence": {"gte": 0.7}}})
    assert sorted(item["envelope"]["object_id"] for item in found["items"]) == sorted([made["tie_a"], made["tie_b"]])
    none = await client.search(SCOPE, text="tie", mode="lexical",
                               filter={"quality": {"assessed_confidence": {"gte": 0.71}}})
    assert none["items"] == []


@pytest.mark.parametrize(("meta", "expected"), [
    (rb'{"a":"\u0000","quality_signals":{"assessed_confidence":0.5}}', 0.5),  # jsonb refuses \u0000 itself
    (rb'{"a":"\\u0000","quality_signals":{"assessed_confidence":0.25}}', 0.25),  # an escaped backslash, then text
    (rb'{"a":"\\\u0000","quality_signals":{"assessed_confidence":0.125}}', 0.125),
    (rb'{"quality_signals":{"assessed_confidence":1e999}}', None),
    (rb'{"quality_signals":{"assessed_confidence":"0.5"}}', None),
    (rb'{"quality_signals":{"staleness_score":0.5}}', None),
    (rb'{"a":1}', None),
    (rb'{"quality_signals":{"assessed_confidence":1}}', 1.0),
])
async def test_the_signal_reader_never_raises_on_a_meta_the_projector_stores(
        service: Env, meta: bytes, expected: float | None) -> None:
    """It runs inside the projector's writes (the index): raising there would stop the projection."""
    async with await psycopg.AsyncConnection.connect(service.database_url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT pamledger_quality_signal(%s, 'assessed_confidence')",
                                        (meta,))).fetchone()
    assert row is not None and row[0] == expected
