"""What every `pamledger` command shares: one error format, argument types, content from a file or stdin.

Every failure a CLI user sees is the PAMSPEC error envelope on stderr ({"error": {...}}) with a non-zero
exit, whether it came from the service, from argparse, or from the CLI's own checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from pamledger_client.config import ClientConfig
from pamledger_client.client import MemoryClient
from pamledger_client.errors import PamspecError
from pamledger_client.progress import ProgressReporter
from pamledger_client.protocol.vocabulary import is_valid_id


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def emit_error(error: PamspecError) -> int:
    """Print the error envelope on stderr; the exit code for it."""
    print(json.dumps({"error": error.envelope()}, sort_keys=True), file=sys.stderr, flush=True)
    return 1


def invalid(message: str, **details: Any) -> PamspecError:
    return PamspecError.of("invalid_request", message, details)


def installed_version(distribution: str = "pamledger") -> str:
    """This installation's version (`pamledger --version`), from its package metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are the error envelope too (exit 2, as argparse's own)."""

    def error(self, message: str) -> NoReturn:
        emit_error(invalid(f"{self.prog}: {message}", usage=self.format_usage().strip()))
        sys.exit(2)


def sequence(text: str) -> int:
    """A ledger sequence argument: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def pam_id(text: str) -> str:
    """A PAMSPEC identifier argument (`scheme:rest`), checked here so a typo reads as English, not a regex."""
    if not is_valid_id(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a PAMSPEC id: `scheme:rest` (letters, digits and + . _ : - /), e.g. workspace:demo")
    return text


CONTENT_HELP = "canonical content as JSON; @PATH reads it from a file, - from stdin"


def json_content(text: str) -> Any:
    """Content given inline, as `@path` (read from a file) or `-` (read from stdin), parsed as JSON.

    A file or stdin also lifts the OS's limit on one argument's length (about 128 KB)."""
    source = "argument"
    if text == "-":
        text, source = sys.stdin.read(), "stdin"
    elif text.startswith("@"):
        try:
            text, source = Path(text[1:]).read_text(), text[1:]
        except OSError as exc:
            raise invalid(f"cannot read content file {text[1:]!r}: {exc.strerror}", path=text[1:]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"content is not valid JSON ({source}): {exc}", source=source) from None
    except RecursionError:  # the parser recurses per level; the service refuses far less deep content anyway
        raise invalid(f"content nests too deeply to parse ({source})", source=source) from None


async def connect(config: ClientConfig) -> MemoryClient:
    """The SDK client on the NATS the config or the state dir name (no database needed)."""
    return await MemoryClient.connect(config=config)


CLI_ACTOR = {"actor_id": "actor:cli:user", "actor_kind": "human"}


def add_actor_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--actor-id", type=pam_id, default=None,
                   help="the actor the command names (default: the one your token proves; with auth off actor:cli:user)")
    p.add_argument("--actor-kind", default=None, help="(default: the token's actor's kind; with auth off human)")


async def actor_of(client: MemoryClient, args: argparse.Namespace) -> dict[str, str]:
    """The actor named on the command line, else the authenticated one (asked once), else actor:cli:user."""
    if args.actor_id is not None:
        return {"actor_id": args.actor_id, "actor_kind": args.actor_kind or "human"}
    me = await client.me(CLI_ACTOR)
    return {"actor_id": me["actor_id"], "actor_kind": args.actor_kind or me["actor_kind"]}


def add_writer_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every write command shares: who acts, and the provenance the CLI records for it."""
    add_actor_arguments(p)
    p.add_argument("--provenance-id", default=None, help="(default: prov:cli)")
    p.add_argument("--activity", default="cli", help="provenance.activity (default: %(default)s)")


def provenance_of(args: argparse.Namespace, actor: dict[str, str]) -> dict[str, Any]:
    """The provenance a CLI write records: --provenance-id (default prov:cli), the actor, --activity."""
    return {"provenance_id": getattr(args, "provenance_id", None) or "prov:cli", "actor": actor,
            "activity": getattr(args, "activity", "cli")}


def progress_for(args: argparse.Namespace, task: str, done_key: str | None = None, total_key: str | None = None,
                 unit: str = "") -> ProgressReporter:
    """The one progress style (pamledger_client.progress): a bar on a terminal, JSON lines on stderr otherwise,
    nothing with --quiet; stdout keeps the one JSON result."""
    return ProgressReporter(task, done_key, total_key, quiet=bool(getattr(args, "quiet", False)), unit=unit)
