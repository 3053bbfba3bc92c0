"""Baseline (c): a NATS service that answers every request with its own payload. No database.

    python -m bench.echo NATS_URL SUBJECT

It is the floor for "request over NATS to a Python asyncio service and back" on this machine.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import nats
from nats.aio.msg import Msg


async def serve(nats_url: str, subject: str) -> None:
    nc = await nats.connect(nats_url, name="bench-echo", pending_size=64 * 1024 * 1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def echo(msg: Msg) -> None:
        if msg.reply:
            await nc.publish(msg.reply, msg.data)

    await nc.subscribe(subject, cb=echo, pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    await nc.flush()
    await stop.wait()
    await nc.drain()


def main() -> int:
    nats_url, subject = sys.argv[1], sys.argv[2]
    asyncio.run(serve(nats_url, subject))
    return 0


if __name__ == "__main__":
    sys.exit(main())
