"""The soak's table (kills per target with recovery p50/max, client errors by code, the checks) and its JSON."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from soak.chaos import TARGETS, Chaos
from soak.load import Record


def summary(options: dict[str, Any], chaos: Chaos, record: Record, checks: dict[str, list[str]]) -> dict[str, Any]:
    kills = {}
    for target in TARGETS:
        times = [k.recovery_seconds for k in chaos.kills if k.target == target]
        back = [t for t in times if t is not None]
        kills[target] = {"kills": len(times), "not_recovered": len(times) - len(back),
                         "recovery_p50_s": round(statistics.median(back), 2) if back else None,
                         "recovery_max_s": round(max(back), 2) if back else None}
    by_code: Counter[str] = Counter()
    for (_, code), count in record.errors.items():
        by_code[code] += count
    return {"options": options, "kills": kills, "operations": dict(record.operations),
            "given_up": dict(record.given_up), "errors_by_code": dict(by_code.most_common()),
            "errors_by_operation": {f"{op} {code}": n for (op, code), n in sorted(record.errors.items())},
            "acknowledged_writes": len(record.acked), "erased_canaries": len(record.canaries),
            "subscriptions": len(record.watched), "events_delivered": sum(len(w.received) for w in record.watched),
            "checks": checks, "passed": not any(checks.values())}


def table(report: dict[str, Any]) -> str:
    o = report["options"]
    lines = [f"pamledger soak: {o['duration']} s, seed {o['seed']}, {o['workers']} workers, "
             f"{report['subscriptions']} subscriptions, a SIGKILL every ~{o['kill_interval']} s",
             "", f"{'killed':<10} {'kills':>5} {'not back':>8} {'recovery p50 s':>14} {'max s':>7}"]
    for target, row in report["kills"].items():
        p50 = "-" if row["recovery_p50_s"] is None else f"{row['recovery_p50_s']:.2f}"
        top = "-" if row["recovery_max_s"] is None else f"{row['recovery_max_s']:.2f}"
        lines.append(f"{target:<10} {row['kills']:>5} {row['not_recovered']:>8} {p50:>14} {top:>7}")
    total = sum(r["kills"] for r in report["kills"].values())
    lines += [f"{'total':<10} {total:>5}", ""]
    lines.append("acknowledged: " + ", ".join(f"{k} {v}" for k, v in sorted(report["operations"].items()))
                 + f"; events delivered to subscriptions {report['events_delivered']}")
    if report["given_up"]:
        lines.append("writes given up (never acknowledged): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(report["given_up"].items())))
    lines.append("client errors by code: " + (", ".join(f"{k} {v}" for k, v in report["errors_by_code"].items())
                                              or "none"))
    lines.append("")
    for name, problems in report["checks"].items():
        lines.append(f"{'FAIL' if problems else 'ok  '}  {name}" + (f" ({len(problems)})" if problems else ""))
        lines += [f"        {p}" for p in problems[:10]]
    lines.append("")
    lines.append("SOAK PASSED" if report["passed"] else "SOAK FAILED")
    return "\n".join(lines)
