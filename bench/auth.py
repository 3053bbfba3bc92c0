"""`python -m bench auth`: what authorization costs the write path (issue 14, "Speed").

Scenario (a) of `python -m bench` (bench/README.md), run in pairs in ONE run: the real service with
`PAMLEDGER_AUTH__MODE=off` (the load carries no credential, exactly bench (a)) and with
`PAMLEDGER_AUTH__MODE=enforce`, where the load carries a real issued token: the bench's actor
(`actor:bench:agent`) registered by the administrative token with a grant `scope:bench=create`, a token
issued for it, every create sent with `Authorization: Bearer <token>`. Each run is a fresh database and a
fresh service, 64 in flight for warm-up + duration, then (as bench (a) does) a second fresh service for the
serial run (1 in flight). The order alternates per pair (off first, then enforce first) so a drift of the
shared machine does not always fall on the same side. Baselines of the same run: the NATS echo service
(bench.echo) with the enforce load's payload and headers, 64 in flight and serial, and the durable-commit
floor. Target: enforce/off throughput >= 0.90 (the check costs the write path at most 10%).

    .venv/bin/python -m bench auth                  # 3 pairs, 10 s measured each (~5 min)
    .venv/bin/python -m bench auth --pairs 2 --duration 5
    .venv/bin/python -m bench auth --quick          # 1 pair, 2.5 s: a smoke test
    .venv/bin/python -m bench auth --json m6.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from authz.bootstrap import read_token
from bench.baselines import run_commit_floor
from bench.load import ACTOR, SCOPE_ID, Maker, Result, check_echo, check_result, create_payload, create_scope, drive
from bench.procs import Child
from bench.scenarios import other_cpu, writer_status
from bench.servers import Servers, bench_servers
from bench.service import echo_service, service_process
from infra.logging import configure_logging
from pamledger_client.protocol.subjects import command_subject
from pamledger_client.admin import issue_token, parse_grant, put_actor
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from schemas.auth import AUTHORIZATION_HEADER

TARGET = 0.90  # enforce / off creates per second
GRANT = f"{SCOPE_ID}=create"


def log(text: str) -> None:
    print(f"bench auth: {text}", file=sys.stderr, flush=True)


def requests(tag: str, token: str | None) -> Maker:
    """bench (a)'s create (same body, unique idempotency key), plus the bearer header when `token` is set."""
    payload = create_payload()
    auth = {AUTHORIZATION_HEADER: f"Bearer {token}"} if token else {}
    return lambda i: (payload, {"Pam-Idempotency-Key": f"bench:{tag}:{i}", **auth})


async def _wait_token_works(nc: NATS, prefix: str, token: str, timeout: float = 20.0) -> None:
    """The service takes a new credential at its next grants refresh (<= 0.5 s): create until one succeeds."""
    make = requests("probe-" + uuid.uuid4().hex[:8], token)
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        payload, headers = make(i)
        i += 1
        msg = await nc.request(command_subject(prefix, "create"), payload, timeout=10, headers=headers)
        if msg.data.startswith(b'{"result":'):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the issued token is still refused after {timeout:g} s: {msg.data[:400]!r}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def service(servers: Servers, label: str, mode: str, roles: str = "all",
                  ) -> AsyncIterator[tuple[NATS, str, Child, str | None, str | None]]:
    """(nc, prefix, child, token, admin token): the real service on a fresh database with the bench scope;
    with mode "enforce" also the bench actor, its grant and a freshly issued token the service already accepts
    (the admin token reads the writer's status: positions need the system scope)."""
    db_name, db_url = servers.fresh_database(label)
    secrets = servers.work_dir / f"secrets-{label}-{uuid.uuid4().hex[:8]}"
    env = {"PAMLEDGER_AUTH__MODE": mode, "PAMLEDGER_AUTH__ADMIN_TOKEN_FILE": str(secrets / "admin.token"),
           "PAMLEDGER_AUTH__SERVICE_TOKEN_FILE": str(secrets / "service.token")}
    try:
        async with service_process(servers, db_url, label, env, roles=roles) as (nc, prefix, _stream, child):
            if mode == "off":
                await create_scope(nc, prefix)
                yield nc, prefix, child, None, None
                return
            admin_token = read_token(secrets / "admin.token")
            if admin_token is None:
                raise RuntimeError(f"the service made no admin token in {secrets}")
            admin = MemoryClient(nc, prefix, timeout=10.0, token=admin_token)
            await admin.create_scope(SCOPE_ID)
            await put_actor(admin, ACTOR["actor_id"], ACTOR["actor_kind"], [parse_grant(GRANT)])
            token = (await issue_token(admin, ACTOR["actor_id"], label="bench"))["token"]
            await _wait_token_works(nc, prefix, token)
            yield nc, prefix, child, token, admin_token
    finally:
        servers.drop_database(db_name)


async def creates(servers: Servers, mode: str, label: str, in_flight: int, warmup: float, duration: float,
                  roles: str = "all") -> Result:
    """One measured window of creates on a fresh service; CPU per create by process; ledger rows checked."""
    async with service(servers, label, mode, roles) as (nc, prefix, child, token, admin_token):
        cpu0, others0 = child.cpu_by_process(), other_cpu(servers)
        name = f"(a) create, auth {mode}{', serial' if in_flight == 1 else ''}"
        result = await drive(nc, command_subject(prefix, "create"), name, requests(uuid.uuid4().hex[:8], token),
                             check_result, in_flight, warmup, duration)
        cpu1, others1 = child.cpu_by_process(), other_cpu(servers)
        sent = result.extra["sent"]
        by_process = {k: round((v - cpu0.get(k, 0.0)) / sent * 1e6) for k, v in cpu1.items()}
        status = await writer_status(nc, prefix, admin_token)
        if status["ledger_sequence"] < result.ok:
            raise RuntimeError(f"ledger has {status['ledger_sequence']} rows, fewer than the {result.ok} successes")
    result.extra.update(mode=mode, service_cpu_us_per_create=sum(by_process.values()),
                        service_cpu_us_per_create_by_process=by_process,
                        other_cpu_us_per_create={k: round((v - others0[k]) / sent * 1e6) for k, v in others1.items()},
                        ledger_sequence_at_end=status["ledger_sequence"])
    return result


async def echo(servers: Servers, in_flight: int, warmup: float, duration: float) -> Result:
    """bench (c): the NATS floor with the enforce load's payload and headers (a token-shaped header)."""
    fake = "pam_0123456789abcdef_" + "A" * 43
    async with echo_service(servers, "m6c") as (nc, subject):
        return await drive(nc, subject, f"(c) NATS echo{', serial' if in_flight == 1 else ''}",
                           requests(uuid.uuid4().hex[:8], fake), check_echo, in_flight, warmup, duration)


def _ms(r: Result, q: float) -> float:
    return r.quantile(q) * 1e3


def pair_ratios(off: Result, on: Result) -> dict[str, float]:
    def writer(r: Result) -> int:
        return max(1, int(r.extra["service_cpu_us_per_create_by_process"].get("writer", 0)))
    return {"throughput": on.rate / off.rate, "p50": on.quantile(0.5) / off.quantile(0.5),
            "p99": on.quantile(0.99) / off.quantile(0.99),
            "cpu": on.extra["service_cpu_us_per_create"] / max(1, off.extra["service_cpu_us_per_create"]),
            "writer_cpu": writer(on) / writer(off)}


def render(runs: list[dict[str, Any]], base: dict[str, Result], header: str) -> tuple[str, dict[str, Any]]:
    lines = [header, "", f"{'run':<40} {'creates/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'svc CPU us/create':>18}"
             "  by process"]
    for i, run in enumerate(runs, 1):
        for key in run["order"]:
            for k in (key, key + "_serial"):
                if k not in run:
                    continue
                r = run[k]
                lines.append(f"pair {i}: {r.name:<32} {r.rate:>10.1f} {_ms(r, .5):>8.2f} {_ms(r, .99):>8.2f}"
                             f" {r.extra['service_cpu_us_per_create']:>18}  {r.extra['service_cpu_us_per_create_by_process']}")
    for k in ("c", "c_serial", "commit"):
        if k in base:
            r = base[k]
            lines.append(f"{'baseline: ' + r.name:<40} {r.rate:>10.1f} {_ms(r, .5):>8.2f} {_ms(r, .99):>8.2f}")
    lines += ["", "enforce / off, per pair (64 in flight: throughput, p50, p99, CPU per create of the service and of"
              " its writer process; serial: p50)"]
    loaded, serial = [], []
    for i, run in enumerate(runs, 1):
        lr = pair_ratios(run["off"], run["enforce"])
        sr = pair_ratios(run["off_serial"], run["enforce_serial"]) if "off_serial" in run else None
        loaded.append(lr)
        if sr is not None:
            serial.append(sr)
        lines.append(f"pair {i} (order {'/'.join(run['order'])}): throughput {lr['throughput']:.3f}, p50 {lr['p50']:.3f},"
                     f" p99 {lr['p99']:.3f}, CPU {lr['cpu']:.3f}, writer CPU {lr['writer_cpu']:.3f}"
                     + (f"; serial p50 {sr['p50']:.3f}" if sr is not None else ""))
    verdict: dict[str, Any] = {
        "throughput_ratio_median": statistics.median(r["throughput"] for r in loaded),
        "p50_ratio_median": statistics.median(r["p50"] for r in loaded),
        "cpu_ratio_median": statistics.median(r["cpu"] for r in loaded),
        "writer_cpu_ratio_median": statistics.median(r["writer_cpu"] for r in loaded),
        "serial_p50_ratio_median": statistics.median(r["p50"] for r in serial) if serial else None,
        "pairs": [{"loaded": lr, "serial": serial[i] if serial else None} for i, lr in enumerate(loaded)],
    }
    if "c" in base:
        for mode in ("off", "enforce"):
            verdict[f"a_{mode}_over_c_median"] = statistics.median(run[mode].rate / base["c"].rate for run in runs)
        lines.append(f"a/c (vs NATS echo, same run): auth off {verdict['a_off_over_c_median']:.3f},"
                     f" enforce {verdict['a_enforce_over_c_median']:.3f} (medians over pairs)")
    if {"c_serial", "commit"} <= base.keys() and serial:
        floor = base["c_serial"].quantile(0.5) + base["commit"].quantile(0.5)
        for mode in ("off", "enforce"):
            verdict[f"serial_{mode}_over_floor_median"] = statistics.median(
                run[f"{mode}_serial"].quantile(0.5) / floor for run in runs)
        lines.append(f"serial p50(a) / (p50 echo + p50 commit): auth off {verdict['serial_off_over_floor_median']:.3f},"
                     f" enforce {verdict['serial_enforce_over_floor_median']:.3f} (<= 1.5)")
    ok = verdict["throughput_ratio_median"] >= TARGET
    verdict["pass"] = ok
    lines.append(f"{'PASS' if ok else 'MISS'} enforce/off throughput, median of {len(runs)} pair(s):"
                 f" {verdict['throughput_ratio_median']:.3f} (>= {TARGET:.2f}); p50 {verdict['p50_ratio_median']:.3f},"
                 + (f" serial p50 {verdict['serial_p50_ratio_median']:.3f}," if serial else "")
                 + f" CPU/create: service {verdict['cpu_ratio_median']:.3f}, writer {verdict['writer_cpu_ratio_median']:.3f}")
    return "\n".join(lines), verdict


def run(args: argparse.Namespace) -> int:
    duration = 2.5 if args.quick else args.duration
    warmup = 0.5 if args.quick else min(2.0, max(0.5, 0.2 * duration))
    pairs = 1 if args.quick else args.pairs
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    runs: list[dict[str, Any]] = []
    base: dict[str, Result] = {}
    with bench_servers() as servers:
        log(f"{'private servers' if servers.private else 'given servers'}; {pairs} pair(s), {duration:g} s measured"
            f" after {warmup:g} s warm-up, {args.in_flight} in flight then 1")
        log("baselines: NATS echo (64 in flight, serial) and the durable-commit floor")
        base["c"] = asyncio.run(echo(servers, args.in_flight, warmup, duration))
        base["c_serial"] = asyncio.run(echo(servers, 1, warmup, duration))
        db_name, url = servers.fresh_database("m6commit", migrated=False)
        try:
            base["commit"] = run_commit_floor(url, warmup, duration)
        finally:
            servers.drop_database(db_name)
        for i in range(pairs):
            order = ("off", "enforce") if i % 2 == 0 else ("enforce", "off")
            run_: dict[str, Any] = {"order": order}
            for mode in order:
                log(f"pair {i + 1}: auth {mode}, {args.in_flight} in flight{', then serial' if args.serial else ''}")
                run_[mode] = asyncio.run(creates(servers, mode, f"m6{mode[:2]}", args.in_flight, warmup, duration,
                                                 args.roles))
                if args.serial:
                    run_[mode + "_serial"] = asyncio.run(creates(servers, mode, f"m6{mode[:2]}s", 1, warmup, duration,
                                                                 args.roles))
            runs.append(run_)

    header = (f"pamledger bench auth: scenario (a) with auth off and enforced; {pairs} pair(s); {duration:g} s"
              f" measured after {warmup:g} s warm-up; roles {args.roles}; {os.cpu_count()} cores;"
              f" {time.perf_counter() - began:.0f} s wall; 1-min load average {load_before:.1f} at start,"
              f" {os.getloadavg()[0]:.1f} at end")
    text, verdict = render(runs, base, header)
    print(text)
    if args.json is not None:
        out = {"meta": {"pairs": pairs, "duration": duration, "warmup": warmup, "in_flight": args.in_flight, "roles": args.roles,
                        "cores": os.cpu_count(), "loadavg_start": load_before, "loadavg_end": os.getloadavg()[0],
                        "time": time.time()},
               "baselines": {k: v.summary() for k, v in base.items()},
               "runs": [{k: (v.summary() if isinstance(v, Result) else v) for k, v in r.items()} for r in runs],
               "verdict": verdict}
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench auth", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="off/enforce pairs (default 3)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="1 pair, 2.5 s per run")
    parser.add_argument("--no-serial", dest="serial", action="store_false",
                        help="skip the serial (1 in flight) runs: twice the pairs in the same time")
    parser.add_argument("--roles", default="all", help="`pamledger run --roles` (default all, as bench (a); e.g."
                        " writer,query,projector,gateway leaves the indexer's embedding work out)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.duration <= 0 or args.in_flight < 1:
        parser.error("--pairs >= 1, --duration > 0, --in-flight >= 1")
    configure_logging("console", os.environ.get("PAMLEDGER_BENCH_LOG_LEVEL", "warning"))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return run(args)
    except KeyboardInterrupt:
        log("interrupted; services and servers stopped")
        return 130
    except PamspecError as exc:
        log(f"FAILED: {exc.envelope()}")
        return 1
