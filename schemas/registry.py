"""The type registry: object types, their content schemas and the state-transition tables as one frozen value.

The writer's pure core reads these tables from the registry it is handed, never from module constants, so
record types and relationship types can be installed later by building a new registry (a pure function of
the old one) instead of editing code. The writer shell builds the default registry once, at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgspec

from schemas.auth import AUTH_CONTENT_SCHEMAS
from schemas.common import EXTENSION_TYPE_PATTERNS, STANDARD_OBJECT_TYPES
from schemas.content import CONTENT_SCHEMAS
from schemas.errors import InvalidObject
from schemas.transitions import NEEDS_POLICY_BASIS, OVERRIDABLE, TRANSITIONS

ContentSchema = type[msgspec.Struct]
TransitionTable = Mapping[str, tuple[str, ...]]
QualifiedMoves = Mapping[str, Mapping[tuple[str, str], str]]  # dimension -> (from, to) -> the policy it needs
DEFAULT_INITIAL_LIFECYCLE = "active"
INITIAL_LIFECYCLE: dict[str, str] = {"working_memory": "scratch"}  # types that start elsewhere than active


@dataclass(frozen=True, slots=True)
class TypeRegistry:
    """What the core accepts: object types, content schemas, initial lifecycles, transitions per dimension.

    Build one with `make_registry` (which freezes every table and derives `states`); read-only after.
    """

    object_types: frozenset[str]  # types accepted without a schema_id (the standard ones)
    extension_patterns: tuple[re.Pattern[str], ...]  # other types need one of these shapes and a schema_id
    content_schemas: Mapping[str, ContentSchema]
    initial_lifecycle: Mapping[str, str]
    transitions: Mapping[str, TransitionTable]
    states: Mapping[str, frozenset[str]]  # every state a dimension's table names, derived
    needs_policy_basis: QualifiedMoves = field(default_factory=dict)  # allowed moves that need a policy_basis
    overridable: QualifiedMoves = field(default_factory=dict)  # forbidden moves a policy override may make

    def transition_rule(self, dimension: str, current: str, target: str) -> tuple[str, str | None]:
        """How `current` -> `target` may happen: ("allowed", None), ("needs_policy_basis", policy),
        ("needs_override", policy) or ("forbidden", None)."""
        override = self.overridable.get(dimension, {}).get((current, target))
        if override is not None:
            return ("needs_override", override)
        if target in self.allowed_targets(dimension, current):
            policy = self.needs_policy_basis.get(dimension, {}).get((current, target))
            return ("allowed", None) if policy is None else ("needs_policy_basis", policy)
        return ("forbidden", None)

    def is_extension_type(self, object_type: str) -> bool:
        """True for reverse-DNS or URI object types, which PAMSPEC allows with a schema_id."""
        return any(p.match(object_type) for p in self.extension_patterns)

    def lifecycle_at_creation(self, object_type: str) -> str:
        """The lifecycle state an object of this type starts in when the command names none."""
        return self.initial_lifecycle.get(object_type, DEFAULT_INITIAL_LIFECYCLE)

    def allowed_targets(self, dimension: str, current: str) -> tuple[str, ...]:
        """States reachable from `current` in one transition of `dimension`."""
        return self.transitions[dimension].get(current, ())

    def check_content(self, object_type: str, content: Any) -> None:
        """Raise InvalidObject when content breaks its type's content schema; types without one pass."""
        schema = self.content_schemas.get(object_type)
        if schema is None:
            return
        try:
            msgspec.convert(content, schema, strict=True)
        except msgspec.ValidationError as exc:
            raise InvalidObject(
                f"canonical_content does not match the {object_type} content schema: {exc}",
                details={"object_type": object_type, "reason": str(exc)},
            ) from None


def make_registry(
    object_types: Iterable[str],
    extension_patterns: Iterable[re.Pattern[str]],
    content_schemas: Mapping[str, ContentSchema],
    initial_lifecycle: Mapping[str, str],
    transitions: Mapping[str, Mapping[str, Iterable[str]]],
    needs_policy_basis: QualifiedMoves | None = None,
    overridable: QualifiedMoves | None = None,
) -> TypeRegistry:
    """A registry holding read-only copies of the given tables, so no caller can change it afterwards."""
    tables = {dim: MappingProxyType({src: tuple(dst) for src, dst in table.items()})
              for dim, table in transitions.items()}
    states = {dim: frozenset(table).union(*table.values()) for dim, table in tables.items()}
    return TypeRegistry(
        object_types=frozenset(object_types),
        extension_patterns=tuple(extension_patterns),
        content_schemas=MappingProxyType(dict(content_schemas)),
        initial_lifecycle=MappingProxyType(dict(initial_lifecycle)),
        transitions=MappingProxyType(tables),
        states=MappingProxyType(states),
        needs_policy_basis=_frozen_moves(needs_policy_basis),
        overridable=_frozen_moves(overridable),
    )


def _frozen_moves(moves: QualifiedMoves | None) -> QualifiedMoves:
    return MappingProxyType({dim: MappingProxyType(dict(table)) for dim, table in (moves or {}).items()})


def default_registry() -> TypeRegistry:
    """The standard types, their content schemas (and those of the actor and credential records of
    schemas.auth) and the section 9.5 transition tables."""
    return make_registry(STANDARD_OBJECT_TYPES, EXTENSION_TYPE_PATTERNS, {**CONTENT_SCHEMAS, **AUTH_CONTENT_SCHEMAS},
                         INITIAL_LIFECYCLE, TRANSITIONS, NEEDS_POLICY_BASIS, OVERRIDABLE)


def with_object_type(
    registry: TypeRegistry, object_type: str, content_schema: ContentSchema | None = None,
    initial_lifecycle: str | None = None,
) -> TypeRegistry:
    """A new registry that also accepts `object_type` (without a schema_id), optionally with a content
    schema and a lifecycle state to start in; `registry` itself is unchanged."""
    if initial_lifecycle is not None and initial_lifecycle not in registry.states["lifecycle"]:
        raise ValueError(f"{initial_lifecycle!r} is not a lifecycle state of this registry")
    schemas = dict(registry.content_schemas)
    if content_schema is not None:
        schemas[object_type] = content_schema
    lifecycles = dict(registry.initial_lifecycle)
    if initial_lifecycle is not None:
        lifecycles[object_type] = initial_lifecycle
    return make_registry(registry.object_types | {object_type}, registry.extension_patterns, schemas, lifecycles,
                         registry.transitions, registry.needs_policy_basis, registry.overridable)


def with_transition(registry: TypeRegistry, dimension: str, source: str, target: str) -> TypeRegistry:
    """A new registry whose `dimension` table also allows `source` -> `target` (either may be a new state), with
    no policy basis or override asked; `registry` itself is unchanged."""
    tables = {dim: dict(table) for dim, table in registry.transitions.items()}
    table = tables.setdefault(dimension, {})
    targets = table.get(source, ())
    table[source] = targets if target in targets else (*targets, target)
    table.setdefault(target, ())
    # An installed move is plainly allowed: it no longer needs the policy the default tables qualify it with.
    qualified = [{dim: {pair: policy for pair, policy in moves.items() if (dim, pair) != (dimension, (source, target))}
                  for dim, moves in table.items()} for table in (registry.needs_policy_basis, registry.overridable)]
    return make_registry(registry.object_types, registry.extension_patterns, registry.content_schemas,
                         registry.initial_lifecycle, tables, qualified[0], qualified[1])
