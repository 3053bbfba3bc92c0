"""`pamledger relate | redact | promote | correct-provenance`: the object-model commands of the CLI.

Each prints the command's result as JSON on stdout; a failure prints the PAMSPEC error envelope on stderr
and exits non-zero, like every other command (pamledger_client.cli.run_command).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pamledger_client.config import ClientConfig
from pamledger_client.types import WriteResult
from pamledger_client.cli_common import (
    CONTENT_HELP,
    actor_of,
    add_actor_arguments,
    add_writer_arguments,
    connect,
    invalid,
    json_content,
    pam_id,
    print_json,
    provenance_of,
)
from pamledger_client.client import MemoryClient
from pamledger_client.protocol.vocabulary import DIMENSION_STATES, DIRECTIONALITIES, RELATIONSHIP_VOCABULARY

OBJECT_COMMANDS = ("relate", "redact", "promote", "correct-provenance")


def add_object_parsers(sub: Any) -> None:
    """The four commands' parsers, added to `sub`."""
    relate = sub.add_parser("relate", help="relate two objects (a versioned Relationship Object)",
                            description="Creates a Relationship Object from SOURCE to TARGET; with --relationship-id "
                                        "and --expected-version-id writes its next version.")
    relate.add_argument("scope_id", type=pam_id)
    relate.add_argument("source_object_id", type=pam_id)
    relate.add_argument("target_object_id", type=pam_id)
    relate.add_argument("relationship_type", help=f"one of {', '.join(RELATIONSHIP_VOCABULARY)}, or a reverse-DNS "
                                                  "or URI name of your own")
    relate.add_argument("--directionality", default="directed", choices=DIRECTIONALITIES, help="(default: %(default)s)")
    relate.add_argument("--content", help=f"the relationship's canonical content ({CONTENT_HELP}; default {{}})")
    relate.add_argument("--relationship-id", type=pam_id)
    relate.add_argument("--expected-version-id", type=pam_id, help="the current version, to update a relationship")
    relate.add_argument("--target-scope", type=pam_id, dest="target_scope_id",
                        help="the target's scope when it is not SCOPE (needs --policy-basis)")
    relate.add_argument("--policy-basis")
    relate.add_argument("--validation", dest="validation_state", choices=sorted(DIMENSION_STATES["validation"]),
                        help="validation state at creation (default: unverified)")
    add_writer_arguments(relate)

    redact = sub.add_parser("redact", help="redact an object's content (whole, or at JSON Pointers)",
                            description="Without --pointer the whole content is redacted (availability redacted); "
                                        "each --pointer replaces one value by \"[REDACTED]\" (partially_redacted).")
    _object_version(redact)
    redact.add_argument("--policy-basis", required=True, help="the policy the redaction applies (required)")
    redact.add_argument("--pointer", dest="pointers", action="append", metavar="POINTER",
                        help="repeatable; an RFC 6901 JSON Pointer into the content, e.g. /statement")
    redact.add_argument("--suppress", action="store_true",
                        help="suppress instead of erasing: the content is kept in storage and can be restored")
    add_writer_arguments(redact)

    promote = sub.add_parser("promote", help="promote working memory into a canonical object")
    promote.add_argument("scope_id", type=pam_id)
    promote.add_argument("source_object_id", type=pam_id)
    promote.add_argument("expected_version_id", type=pam_id)
    promote.add_argument("target_object_type", help="claim, decision, task, summary ... or an extension type")
    promote.add_argument("content", help=f"the new object's canonical content ({CONTENT_HELP})")
    promote.add_argument("--target-object-id", type=pam_id)
    promote.add_argument("--schema-id", dest="target_schema_id", help="needed for an extension type")
    promote.add_argument("--validation", dest="target_validation_state",
                         choices=sorted(DIMENSION_STATES["validation"]), help="(default: unverified)")
    promote.add_argument("--relationship-id", type=pam_id, help="the id of the derived_from relationship")
    add_writer_arguments(promote)

    correct = sub.add_parser("correct-provenance", help="write a new version with corrected provenance",
                             description="PROVENANCE is the whole corrected provenance object (its actor defaults to "
                                         "the command's actor). Fields the current provenance has and PROVENANCE "
                                         "lacks must be named with --remove.")
    _object_version(correct)
    correct.add_argument("provenance", help=f"the corrected provenance ({CONTENT_HELP})")
    correct.add_argument("--remove", dest="removed_fields", action="append", metavar="FIELD",
                         help="repeatable; a provenance field the correction removes on purpose")
    correct.add_argument("--policy-basis")
    add_actor_arguments(correct)  # the provenance comes whole, so no --provenance-id / --activity


def _object_version(parser: argparse.ArgumentParser) -> None:
    for name in ("scope_id", "object_id", "expected_version_id"):
        parser.add_argument(name, type=pam_id)


def cmd_objects(config: ClientConfig, args: argparse.Namespace) -> int:
    print_json(asyncio.run(_call(config, args)))
    return 0


async def _call(config: ClientConfig, args: argparse.Namespace) -> Any:
    # Content and provenance are read before connecting: they may come from stdin, and bad JSON costs nothing.
    content = json_content(args.content) if getattr(args, "content", None) is not None else None
    corrected = json_content(args.provenance) if args.command == "correct-provenance" else None
    if corrected is not None and not isinstance(corrected, dict):
        raise invalid("provenance must be a JSON object", argument="provenance")
    client = await connect(config)
    try:
        actor = await actor_of(client, args)
        if corrected is not None:
            return await client.correct_provenance(
                args.scope_id, args.object_id, args.expected_version_id, actor, {"actor": actor, **corrected},
                removed_fields=args.removed_fields, policy_basis=args.policy_basis)
        return await _write(client, args, actor, provenance_of(args, actor), content)
    finally:
        await client.close()


async def _write(client: MemoryClient, args: argparse.Namespace, actor: dict[str, str], provenance: dict[str, Any],
                 content: Any) -> WriteResult:
    if args.command == "relate":
        return await client.relate(
            args.scope_id, args.source_object_id, args.target_object_id, args.relationship_type, actor, provenance,
            directionality=args.directionality, canonical_content=content, relationship_id=args.relationship_id,
            expected_version_id=args.expected_version_id, target_scope_id=args.target_scope_id,
            policy_basis=args.policy_basis, validation_state=args.validation_state)
    if args.command == "redact":
        return await client.redact(args.scope_id, args.object_id, args.expected_version_id, actor, provenance,
                                   args.policy_basis, pointers=args.pointers, erase=not args.suppress)
    return await client.promote(
        args.scope_id, args.source_object_id, args.expected_version_id, args.target_object_type, content, actor,
        provenance, target_object_id=args.target_object_id, target_schema_id=args.target_schema_id,
        target_validation_state=args.target_validation_state, relationship_id=args.relationship_id)
