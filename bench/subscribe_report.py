"""The subscribe benchmark's table: values, targets, same-run baselines and PASS/MISS; and the JSON form."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

CATCHUP_RATIO = 0.5
LIVE_P50_MS, LIVE_P99_MS = 5.0, 25.0
Row = tuple[str, str, str, str, str]  # label, value, target, same-run baseline, verdict


def _ms(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f} ms"


def _pq(stats: dict[str, Any]) -> str:
    return f"{_ms(stats['p50_ms'])} / {_ms(stats['p99_ms'])}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _signs_row(signs: dict[str, int]) -> Row:
    """NATS disconnected the service as a slow consumer (replies, pushes and relay publishes lost)?"""
    others = ", ".join(f"{k} {v}" for k, v in signs.items() if k != "slow_consumer_disconnects" and v)
    return ("  service cut off as NATS slow consumer", f"{signs['slow_consumer_disconnects']} times", "0",
            f"service log: {others or 'no errors'}", _verdict(signs["slow_consumer_disconnects"] == 0))


def _catchup(c: dict[str, Any]) -> list[Row]:
    sdk, raw, ex = c["sdk"], c["raw"], c["raw_explicit"]
    rep, load = c["replication"], c["load"]
    return [
        ("1 catch-up: ledger (one scope)", f"{c['head']:,} events", "", f"loaded {load['events_per_second']:,} ev/s;"
         f" relay {rep['relay_seconds']} s", ""),
        ("  SDK subscribe(after_sequence=0), events/s", f"{sdk['events_per_second']:,.0f}", "",
         f"raw pull {raw['events_per_second']:,.0f}", ""),
        ("  SDK / raw JetStream pull (fetch 500, ack all)", f"{c['ratio']:.2f}", f">= {CATCHUP_RATIO}",
         f"ack every msg: {ex['events_per_second']:,.0f} ev/s", _verdict(c["ratio"] >= CATCHUP_RATIO)),
        ("  SDK got every event once, in order", f"{sdk['events']:,} of {c['head']:,}", "all", "",
         _verdict(bool(c["complete"]))),
        ("  SDK open -> first event (big ledger)", f"{sdk['open_seconds'] * 1e3:.1f} / "
         f"{sdk['first_event_seconds'] * 1e3:.1f} ms", "", f"head query {c['head_query']['keyed']['mean_ms']} ms"
         f" (unkeyed {c['head_query']['unkeyed']['mean_ms']})", ""),
        ("  CPU s: service / bench during SDK read", f"{sdk['service_cpu_seconds']} / {sdk['bench_cpu_seconds']}", "",
         f"raw pull bench {raw['bench_cpu_seconds']} s", ""),
    ]


def _live(v: dict[str, Any], light: dict[str, Any] | None) -> list[Row]:
    echo = v["echo"]
    echo_p50 = echo.quantile(0.5) * 1e3
    lag = v["lag"]
    sustained = "sustained" if v["sustained"] else "NOT sustained"
    rows: list[Row] = [
        (f"2 live: 1 SDK subscriber, {v['rate']:,.0f} creates/s", sustained, "", v["stopped"] or
         f"{v['measured_creates']:,} measured", _verdict(v["sustained"])),
        ("  reply -> delivered p50", _ms(lag["p50_ms"]), f"<= {LIVE_P50_MS:g} ms",
         f"{lag['p50_ms'] / echo_p50:.1f} x echo p50", _verdict(lag["p50_ms"] <= LIVE_P50_MS)),
        ("  reply -> delivered p99", _ms(lag["p99_ms"]), f"<= {LIVE_P99_MS:g} ms",
         f"echo p99 {_ms(echo.quantile(0.99) * 1e3)}", _verdict(lag["p99_ms"] <= LIVE_P99_MS)),
        ("  every create delivered", f"{v['measured_creates'] - v['missing']:,} of {v['measured_creates']:,}", "all",
         "", _verdict(v["missing"] == 0)),
        ("  split: reply -> relay publish seen p50/p99", _pq(v["relay"]), "", "", ""),
        ("  split: relay publish -> delivered p50/p99", _pq(v["relay_to_delivery"]), "", "", ""),
        ("  create send -> reply p50/p99", _pq(v["reply"]), "", "", ""),
        ("  CPU share: service / bench process", f"{v['service_cpu_share']} / {v['bench_cpu_share']}", "", "", ""),
        _signs_row(v["log_signs"]),
    ]
    if light:
        rows.append((f"  reference: {light['rate']:,.0f} creates/s, reply -> delivered", _pq(light["lag"]), "",
                     f"split at relay: {_pq(light['relay_to_delivery'])}", ""))
        rows.append((f"  reference: {light['rate']:,.0f} creates/s, every create delivered",
                     f"{light['measured_creates'] - light['missing']:,} of {light['measured_creates']:,}", "all", "",
                     _verdict(light["missing"] == 0)))
    return rows


def _fanout(f: dict[str, Any], live_p50: float | None) -> list[Row]:
    subs, op = f["scopes"] * f["per_scope"], f["open"]
    sent = "sustained" if f["sustained"] else "NOT sustained"
    first, last = f["lag_first_third"], f["lag_last_third"]
    ratio = f"{f['lag']['p50_ms'] / live_p50:.1f} x 1-subscriber p50" if live_p50 else ""
    return [
        (f"3 fan-out: {subs:,} subs ({f['scopes']} scopes x {f['per_scope']}), "
         f"{f['rate']:,.0f} creates/s", sent, "", f["stopped"] or f"{f['sent']:,} sent",
         _verdict(f["sustained"])),
        ("  opened (opens/s; open p50 / p99)", f"{op['subscriptions']:,} of {op['requested']:,} in {op['seconds']} s",
         "all", f"{op['opens_per_second']}/s; {_pq(op)}", _verdict(op["failed"] == 0)),
        ("  after opening: stream consumers; rows open", f"{op['stream_consumers']:,}; "
         f"{op['subscription_rows'].get('open', 0):,}", "", f"subscription_opened entries "
         f"{op['subscription_opened_entries']:,}", ""),
        ("  every subscriber got every event", f"{f['expected_deliveries'] - f['missing_deliveries']:,} of "
         f"{f['expected_deliveries']:,}", "all", f"gaps {f['gaps']} (resumes {f['resumes']}), closed {f['closed']}",
         _verdict(bool(f["complete"]))),
        _signs_row(f["log_signs"]),
        ("  reply -> delivered p50 / p99", _pq(f["lag"]), "", ratio, ""),
        ("  keeps up: deliveries/s during the window", f"{f['deliveries_per_second']:,} of "
         f"{f['deliveries_per_second_needed']:,} needed", ">= 95%", "", _verdict(f["keeps_up"] and f["sustained"])),
        ("  lag p99: first third -> last third", f"{_ms(first['p99_ms'])} -> {_ms(last['p99_ms'])}",
         "no growth", f"p50 {_ms(first['p50_ms'])} -> {_ms(last['p50_ms'])}", _verdict(not f["lag_grew"])),
        ("  still undelivered at last reply; drain", f"{f['undelivered_at_last_reply']:,}", "",
         f"all in {f['drain_after_last_reply_s']} s" if not f["missing_deliveries"] else
         f"{f['missing_deliveries']:,} still missing after {f['drain_after_last_reply_s']} s", ""),
        ("  create send -> reply p50/p99", _pq(f["reply"]), "", "", ""),
        ("  CPU share: service / bench process", f"{f['service_cpu_share']} / {f['bench_cpu_share']}", "", "", ""),
        ("  idle, all open: service / nats-server CPU", f"{f['idle_cpu_share']['service']} / "
         f"{f['idle_cpu_share']['nats_server']}", "", "3 s, no creates", ""),
    ]


def rows(results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    if "catchup" in results:
        out += _catchup(results["catchup"])
    if "live" in results:
        out += _live(results["live"], results.get("light"))
    if "fanout" in results:
        live_p50 = results["live"]["lag"]["p50_ms"] if "live" in results else None
        out += _fanout(results["fanout"], live_p50)
    return out


def render(results: dict[str, Any], header: str) -> str:
    table = rows(results)
    widths = [max(len(r[i]) for r in table + [("measure", "value", "target", "same-run baseline", "verdict")])
              for i in range(5)]
    head = ("measure", "value", "target", "same-run baseline", "verdict")
    lines = [header, "", "  ".join(h.ljust(w) for h, w in zip(head, widths)), "-" * (sum(widths) + 8)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    loads = {k: results[k].get("other_processes_cores") for k in ("catchup", "live", "light", "fanout") if k in results}
    busy = {k: v for k, v in loads.items() if v and v > 0.2}
    lines += ["", "other processes' CPU during each step (cores): " + ", ".join(f"{k} {v}" for k, v in loads.items())
              + (" -- NOT an idle machine, numbers are pessimistic" if busy else "")]
    if "fanout" in results:
        lines.append(f"fan-out subscribers: {results['fanout']['subscriber']}")
        if results["fanout"]["open"]["failed"]:
            lines.append(f"fan-out open failures: {results['fanout']['open']['failure_messages']}")
    verdicts = [r[4] for r in table if r[4]]
    lines.append(f"verdicts: {verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS")
    return "\n".join(lines)


def as_json(results: dict[str, Any], meta: dict[str, Any], jsonable: Callable[[Any], Any]) -> dict[str, Any]:
    table = [dict(zip(("measure", "value", "target", "baseline", "verdict"), r)) for r in rows(results)]
    return {"meta": meta, "table": table, "results": jsonable(results)}
