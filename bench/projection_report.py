"""The projection benchmark's table (values, targets, PASS/MISS), the details under it, and the JSON form."""

from __future__ import annotations

import math
from typing import Any

from bench.load import Result

LOADER_TARGET = 20_000
REPLAY_RATIO_TARGET = 0.25
STRUCTURED_P50_MS = 5.0
FULLTEXT_P50_MS = 20.0
LAG_P99_MS = 100.0


def _ms(r: Result, q: float) -> float:
    return r.quantile(q) * 1e3


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def verdicts(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(label, value, target, verdict) rows; verdict is PASS, MISS or '' for baselines."""
    rows: list[tuple[str, str, str, str]] = []

    def add(label: str, value: str, target: str = "(baseline)", ok: bool | None = None) -> None:
        rows.append((label, value, target, "" if ok is None else "PASS" if ok else "MISS"))

    if "load" in res:
        load = res["load"]
        add("loader: events/s (writer core, hash chain, COPY)", f"{load['events_per_second']:,}",
            f">= {LOADER_TARGET:,}", load["events_per_second"] >= LOADER_TARGET)
        rep = res["replay"]
        add("replay: replay(ReplayOptions()) events/s", f"{rep['replay']['events_per_second']:,}", "")
        add("replay: raw COPY BINARY + msgspec decode events/s", f"{rep['raw_events_per_second']:,}")
        add("replay: ratio replay / raw", f"{rep['ratio']:.3f}", f">= {REPLAY_RATIO_TARGET}",
            rep["ratio"] >= REPLAY_RATIO_TARGET)
        q = res["query"]
        echo = _ms(q["echo"], 0.5)
        for key, label, limit in (("structured", "query: structured p50 / p99 ms", STRUCTURED_P50_MS),
                                  ("page2", "query: structured 2nd page (cursor) p50 / p99 ms", STRUCTURED_P50_MS),
                                  ("fulltext", "query: full text p50 / p99 ms", FULLTEXT_P50_MS)):
            r = q[key]
            add(label, f"{_fmt(_ms(r, 0.5))} / {_fmt(_ms(r, 0.99))}", f"p50 <= {limit:g}", _ms(r, 0.5) <= limit)
        add("query: NATS echo round trip p50 / p99 ms", f"{_fmt(echo, 3)} / {_fmt(_ms(q['echo'], 0.99), 3)}")
        add("query: SQL only p50 ms, structured / full text",
            f"{_fmt(_ms(q['sql_structured'], 0.5))} / {_fmt(_ms(q['sql_fulltext'], 0.5))}")
        for key, name in (("structured", "structured"), ("fulltext", "full text")):
            p50 = _ms(q[key], 0.5)
            add(f"query: {name} p50 / echo p50 (x)", _fmt(p50 / echo if echo else math.nan, 1), "")
            add(f"query: {name} p50 - SQL only p50 (service share, ms)", _fmt(p50 - _ms(q[f"sql_{key}"], 0.5)), "")
    if "lag" in res:
        lag = res["lag"]
        chosen = lag["chosen"]
        lag_r: Result = chosen["lag"]
        add(f"lag: reply -> queryable p50 / p99 ms at {chosen['rate']:,.0f}/s",
            f"{_fmt(_ms(lag_r, 0.5))} / {_fmt(_ms(lag_r, 0.99))}", f"p99 <= {LAG_P99_MS:g}",
            _ms(lag_r, 0.99) <= LAG_P99_MS and chosen["never_queryable"] == 0)
        add("lag: sustained create rate (replies/s in window)", f"{chosen['achieved_replies_per_second']:,.0f}",
            f">= {lag['target_rate']:,}/s", bool(lag["sustained_target"]))
        add("lag: create send -> reply p50 / p99 ms (same run)",
            f"{_fmt(_ms(chosen['create'], 0.5))} / {_fmt(_ms(chosen['create'], 0.99))}")
    if "projector" in res:
        for p in res["projector"]["attempts"]:
            add(f"projector alone: commit -> queryable p50 / p99 ms at {p['rate']:,.0f}/s",
                f"{_fmt(_ms(p['lag'], 0.5))} / {_fmt(_ms(p['lag'], 0.99))}", f"p99 <= {LAG_P99_MS:g}",
                bool(p["sustained"]) and _ms(p["lag"], 0.99) <= LAG_P99_MS)
        add("projector alone: events/s applied (first attempt)", f"{res['projector']['attempts'][0]['drain_events_per_second']:,}",
            f">= {res['projector']['target_rate']:,}/s", res["projector"]["attempts"][0]["sustained"])
    return rows


def render(res: dict[str, Any], header: str) -> str:
    lines = [header, "", f"{'benchmark':<58}{'value':>20}{'target':>14}{'verdict':>9}", "-" * 101]
    for label, value, target, verdict in verdicts(res):
        lines.append(f"{label:<58}{value:>20}{target:>14}{verdict:>9}")
    lines += ["", *_details(res)]
    return "\n".join(lines)


def _details(res: dict[str, Any]) -> list[str]:
    out = _ledger_details(res) if "load" in res else []
    if "lag" in res:
        out += ["", *_lag_details(res)]
    if "projector" in res:
        out.append("")
        for attempt in res["projector"]["attempts"]:
            out += _projector_details(attempt)
    return out


def _projector_details(p: dict[str, Any]) -> list[str]:
    """The projector-alone step (bench.projection_projector)."""
    parts = "; ".join(f"{p[k].name} p50/p99 {_fmt(_ms(p[k], 0.5))}/{_fmt(_ms(p[k], 0.99))} ms"
                      for k in ("relay", "projector"))
    return [f"projector alone: {p['events']:,} creates committed in bulk ({p['load']['seconds']} s), then the relay"
            f" paced at {p['rate']:,.0f}/s: sustained={p['sustained']} {p['stopped']} max pacer delay"
            f" {p['max_pacer_delay_ms']} ms; projection caught up {p['caught_up_after_last_commit_ms']} ms after the"
            f" last commit (reached={p['caught_up']}), applied {p['drain_events_per_second']:,} events/s; n={p['lag'].ok}",
            f"    split: {parts}",
            f"    projector commits: {p['commits']}",
            f"    CPU per event (us): {p['cpu_us_per_event']}"]


def _ledger_details(res: dict[str, Any]) -> list[str]:
    load, rep, proj, q = res["load"], res["replay"], res["projection"], res["query"]
    out = [f"loader: {load['events']:,} events = {load['by_type']}; {load['objects']:,} objects in {load['scopes']}"
           f" scopes; {load['seconds']} s incl. index rebuild {load['index_rebuild_seconds']} s;"
           f" {load['workers']} worker processes (main waited {load['waited_for_workers_seconds']} s for them)"]
    if "verify" in res:
        v = res["verify"]
        out.append(f"loader check: verify_ledger ok={v['ok']} rows={v['rows_checked']:,} ({v['seconds']} s);"
                   f" chunk 0 rows equal plan_batch's; after the writer probe: ok={res['verify_after_probe']['ok']}"
                   f" rows={res['verify_after_probe']['rows_checked']:,}")
    r = rep["replay"]
    out.append(f"replay: {r['events']:,} events -> {r['rows']:,} rows in {r['seconds']} s: read+fold+stage {r['stream_seconds']} s"
               f" ({_fmt(r['stream_events_per_second'] or 0, 0)} events/s), merge+digest {r['merge_digest_seconds']} s"
               f" (the digest alone, re-timed: {r['digest_seconds']} s);"
               f" raw passes {[p['events_per_second'] for p in rep['raw_passes']]} events/s")
    out.append(f"projection for Query: replay --swap {proj['seconds']} s ({proj['events_per_second']:,} events/s incl."
               f" indexes), VACUUM ANALYZE {proj['vacuum_analyze_seconds']} s, current_objects {proj['table_mib']} MiB,"
               f" checkpoint set by replay: {proj['checkpoint_set_by_replay']}")
    p = q["probe"]
    out.append(f"writer probe: update of a loaded object got ledger_sequence {p.get('ledger_sequence')} (expected"
               f" {p.get('expected_sequence')}), projection reached it: {p.get('projection_reached')}, ok={p.get('ok')}")
    out.append(f"query stats: {q['stats']}")
    for key in ("structured", "page2", "fulltext"):
        r2: Result = q[key]
        out.append(f"  {r2.name}: n={r2.ok}")
        for variant, s in r2.extra["variants"].items():
            out.append(f"    {variant:<44} n={s['n']:>6}  p50 {s['p50_ms']:>8.2f} ms  p99 {s['p99_ms']:>8.2f} ms")
    for key in ("explain_structured", "explain_fulltext"):
        e = q[key]
        out += ["", f"EXPLAIN (ANALYZE, BUFFERS) of the slowest sample of each {key.split('_')[1]} variant:"]
        for variant, v in e["variants"].items():
            out.append(f"  {variant:<40} {v['execution']:<26} indexes {','.join(v['indexes']) or 'none'};"
                       f" seq scans {','.join(v['seq_scans']) or 'none'}; pages {v['buffers']}; bitmap heap blocks {v['heap_blocks']};"
                       f" rows removed by filter {v['rows_removed_by_filter']}; sort {','.join(v['sort']) or 'none'}")
        s_ = e["slowest"]
        out += [f"  plan of the slowest variant '{s_['variant']}' (p50 {s_['p50_ms']} ms), request {s_['request']}:",
                *[f"    {line}" for line in s_["summary"]]]
    return out


def _lag_details(res: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for a in res["lag"]["attempts"]:
        out.append(f"lag attempt {a['rate']:,.0f}/s: sustained={a['sustained']} {a['stopped']} replies/s"
                   f" {a['achieved_replies_per_second']:,}, max sender delay {a['max_sender_delay_ms']} ms,"
                   f" service process CPU {a['service_cpu_share']:.0%} of a core,"
                   f" lag p50/p99 {_fmt(_ms(a['lag'], 0.5))}/{_fmt(_ms(a['lag'], 0.99))} ms (n={a['lag'].ok},"
                   f" queryable before the reply {a['queryable_before_reply']}, never {a['never_queryable']})")
        out.append(f"    split: reply -> in stream (relay) p50/p99 {_fmt(_ms(a['reply_to_stream'], 0.5))}/"
                   f"{_fmt(_ms(a['reply_to_stream'], 0.99))} ms; in stream -> queryable (projector) p50/p99"
                   f" {_fmt(_ms(a['stream_to_queryable'], 0.5))}/{_fmt(_ms(a['stream_to_queryable'], 0.99))} ms")
        if a.get("projector_commits"):
            out.append(f"    projector commits: {a['projector_commits']}")
    if res["lag"].get("closed_loop_capacity"):
        out.append(f"lag: service closed-loop capacity (64 in flight, same service) {res['lag']['closed_loop_capacity']:,}"
                   " creates/s")
    m = res["lag"]["projector_batch"]
    out += ["", f"projector live batch of {m['rows']} rows (upsert_rows, auto_explain, rolled back) with"
                f" {m['content_store_rows']:,} content_store rows: {m['batch_seconds'] * 1e3:.0f} ms;"
                f" seq scan of content_store: {m['seq_scan_content_store']}; the same {m['rows']} rows as new objects"
                f" (inserts, index maintenance included, rolled back): {m['insert_seconds'] * 1e3:.0f} ms",
            *[f"  {line[:150]}" for line in m["plan"][:18]]]
    return out


def as_json(res: dict[str, Any], meta: dict[str, Any], jsonable: Any) -> dict[str, Any]:
    return {"meta": meta, "verdicts": [{"label": a, "value": b, "target": c, "verdict": d}
                                       for a, b, c, d in verdicts(res)], "results": jsonable(res)}
