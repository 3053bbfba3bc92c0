"""Smoke test of `python -m bench search` at a tiny size: every path runs the plan it claims, exact is
exact, and the table prints a verdict per target. Not a timed test: the numbers themselves are not checked."""

from __future__ import annotations

from typing import Any

from bench.search import parse_args, run
from bench.search_report import render


def test_search_bench_runs_each_path_on_its_intended_plan_and_exact_is_exact(env: Any) -> None:
    args = parse_args(["--vectors", "2000", "--real", "120", "--queries", "6", "--probe", "100",
                       "--exact-big-queries", "3", "--hnsw", "40,100:10"])
    results = run(env.database_url, args)

    rows = {(r["kind"], r["method"], r["setting"]): r for r in results["rows"]}
    assert len(rows) == 6
    for (kind, method, _), row in rows.items():
        assert row["plan_uses_hnsw"] == (method != "exact"), (kind, method)
        assert 0.0 <= row["recall"] <= 1.0 and row["p50_ms"] > 0
    assert rows[("small", "exact", "CTE of the scope")]["recall"] == 1.0
    assert rows[("big", "exact", "CTE of the scope")]["recall"] == 1.0
    assert results["numpy_agreement"] == {"big": 1.0, "small": 1.0}
    assert results["load"]["rows"] == 2000 and results["load"]["build_s"] > 0

    table = render(results)
    assert "large scope, HNSW" in table and "small scopes, exact" in table
    assert table.count("PASS") + table.count("MISS") == 6 * 2 + 2 * 2
