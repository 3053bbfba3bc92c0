"""stdin and stdout as non-blocking asyncio pipes, handed to the SDK's `stdio_server` as its explicit streams.

Why: the SDK reads stdin and writes stdout through anyio's file wrappers, a worker thread per line each way;
on a busy 2-core machine those two thread hand-offs per message were most of a `pamspec.read`'s latency over
stdio. The SDK's framing, parsing and session logic are unchanged: only the byte pumping is ours. As the SDK
does with its own claim, the wire gets private descriptors and fd 1 then points at stderr, so a stray
`print` from any library can never corrupt a frame. Where stdin or stdout is not a pipe or socket (a file, a
terminal), `None` is returned and the SDK's own streams are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator
from typing import Any


def _pipe_like(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _Lines:
    """`async for line in stdin` (text lines, newline kept), as anyio's AsyncFile offers it."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            try:
                line = await self.reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:
                if end.partial:
                    yield end.partial.decode("utf-8", errors="replace")
                return
            except asyncio.LimitOverrunError:  # a frame longer than the buffer: take it whole, in parts
                line = await self._long_line()
            yield line.decode("utf-8", errors="replace")

    async def _long_line(self) -> bytes:
        parts = []
        while True:
            try:
                parts.append(await self.reader.readuntil(b"\n"))
                return b"".join(parts)
            except asyncio.LimitOverrunError as over:
                parts.append(await self.reader.readexactly(over.consumed))
            except asyncio.IncompleteReadError as end:
                return b"".join(parts) + end.partial


class _Out:
    """`await stdout.write(text)` / `await stdout.flush()` over a pipe transport."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self.writer.drain()


@contextlib.asynccontextmanager
async def pipe_streams(wanted: bool = True) -> AsyncIterator[tuple[Any, Any] | None]:
    """(stdin lines, stdout writer) over private duplicates of fds 0 and 1; None (the SDK's own streams, which
    claim the descriptors themselves) where they are not pipes or `wanted` is false."""
    if not (wanted and _pipe_like(0) and _pipe_like(1)):
        yield None
        return
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # children and stray reads see EOF; stray writes go to stderr
    os.close(devnull)
    os.dup2(2, 1)
    reader = asyncio.StreamReader(limit=1 << 20)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                     os.fdopen(wire_in, "rb", buffering=0))
    write_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                              os.fdopen(wire_out, "wb", buffering=0))
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    try:
        yield _Lines(reader), _Out(writer)
    finally:
        read_transport.close()
        with contextlib.suppress(Exception):
            await writer.drain()
        write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
