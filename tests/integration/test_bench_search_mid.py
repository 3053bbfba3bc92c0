"""Smoke test of `python -m bench search --mid`: mid-size scopes get their own rows (exact, every HNSW
setting, the service's own setting) and a verdict line each; the default layout is unchanged by the option.
Not a timed test: the numbers themselves are not checked."""

from __future__ import annotations

from typing import Any

from bench.search import parse_args, run, service_setting
from bench.search_data import Layout
from bench.search_report import render


def test_mid_layout_carves_mid_scopes_out_of_the_big_one() -> None:
    assert Layout.for_total(200_000) == Layout(100_000, 100, 1_000)
    mid = Layout.for_total(200_000, mid=(5_000, 10_000, 30_000))
    assert (mid.big, mid.small_count, mid.small_size, mid.total) == (55_000, 100, 1_000, 200_000)
    assert mid.scopes().count("bench:mid-30000") == 30_000


def test_search_bench_measures_mid_scopes_with_the_service_setting(env: Any) -> None:
    args = parse_args(["--vectors", "3000", "--real", "120", "--queries", "6", "--probe", "100",
                       "--exact-big-queries", "3", "--exact-mid-queries", "4", "--hnsw", "40", "--mid", "300,600"])
    results = run(env.database_url, args)

    rows = {(r["kind"], r["method"], r["setting"]): r for r in results["rows"]}
    service = service_setting().label
    assert len(rows) == 2 * 2 + 2 * 3
    for kind in ("mid:300", "mid:600"):
        assert rows[(kind, "exact", "CTE of the scope")]["recall"] == 1.0
        assert rows[(kind, "exact", "CTE of the scope")]["queries"] == 4
        assert rows[(kind, "hnsw+rerank", service)]["plan_uses_hnsw"]
    assert results["numpy_agreement"]["mid:600"] == 1.0

    table = render(results)
    assert "0.3k scope, the service's HNSW" in table and "0.6k scope, the service's HNSW" in table
    assert table.count("PASS") + table.count("MISS") == 10 * 2 + 4 * 2


def test_mid_only_keeps_hnsw_rows_for_mid_scopes_and_exact_baselines() -> None:
    from psycopg import sql

    from bench.search import methods, parse_settings
    from bench.search_load import Loaded, Timings

    loaded = Loaded(sql.Identifier("t"), "t_hnsw", Timings(1))
    found = [(m[0], m[1], m[2]) for m in methods(loaded, parse_settings("40,100"), ["big", "small", "mid:5000"], True)]
    assert found == [("big", "exact", "CTE of the scope"), ("small", "exact", "CTE of the scope"),
                     ("mid:5000", "exact", "CTE of the scope"), ("mid:5000", "hnsw+rerank", "ef40/c40/max20000"),
                     ("mid:5000", "hnsw+rerank", "ef100/c100/max20000"),
                     ("mid:5000", "hnsw+rerank", service_setting().label)]
