"""Who may make memory trusted (PAMSPEC 15.5: no unreviewed content silently promoted into trusted memory).

Query and search trust `corroborated` by default, so setting a validation state is a reviewer's act:
- **The `validate` operation** (a pamledger extension of PAMSPEC's operation list; a grant of `*` holds it) is
  needed to set any validation state other than `unverified`: a create's `validation_state`, a promotion's
  `target_validation_state`, a transition of the validation dimension. Refused: access_denied,
  `authz.validate_not_granted`. Under a delegation the principal who granted it must hold `validate` (a
  delegation names PAMSPEC's operations only: it lends its grantor's review power, never more).
- **An update carries its head's validation state only for an actor that could have set it**: new content
  from an actor without `validate` (or, under separation of duties, any new content) is `unverified` again:
  the state reviewed someone else's words, not these.
- **Separation of duties** (scope policy `{"validation": {"separation_of_duties": true}}`, off unless set):
  an actor never corroborates a version it wrote, under its own name or through a delegation it granted
  (the head's actor, the principal it acted for, or its provenance actor): `validation.separation_of_duties`.
  A create or promotion straight to `corroborated` is the actor corroborating its own words, refused alike.
Auth off: every actor holds every operation (core.state.EVERYTHING), so only separation of duties applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from command_handler.core.state import Authority, ObjectHead
from schemas.commands import CreateObject, Promote, TransitionState, UpdateObject
from schemas.auth import VALIDATE
from schemas.errors import AccessDenied

UNVERIFIED = "unverified"
TRUSTED = "corroborated"
NOT_GRANTED = "authz.validate_not_granted"
SEPARATION = "validation.separation_of_duties"


def separation_of_duties(policy: Any) -> bool:
    """Whether a scope's policy asks for separation of duties (`validation.separation_of_duties: true`)."""
    validation = policy.get("validation") if isinstance(policy, Mapping) else None
    return isinstance(validation, Mapping) and validation.get("separation_of_duties") is True


def validation_set(command: Any) -> str | None:
    """The validation state a command sets itself (None: it sets none)."""
    if isinstance(command, CreateObject):
        return command.validation_state
    if isinstance(command, Promote):
        return command.target_validation_state
    if isinstance(command, TransitionState) and command.dimension == "validation":
        return command.target_state
    return None


def needs_scope_policy(command: Any) -> bool:
    """Commands whose decision reads the scope's validation policy (the writer loads it for them)."""
    return validation_set(command) not in (None, UNVERIFIED) or isinstance(command, UpdateObject)


def check_validation(command: CreateObject | Promote | TransitionState, head: ObjectHead | None,
                     authority: Authority, policy: Any) -> None:
    """Raise access_denied when the command sets a validation state its actor may not set (module docstring)."""
    target = validation_set(command)
    if target is None or target == UNVERIFIED:
        return
    reviewer = _reviewer(command.actor)
    if not authority.holds(reviewer, command.scope_id, VALIDATE):
        raise AccessDenied(f"setting validation_state {target!r} needs the validate operation (a reviewer's grant)",
                           rule_id=NOT_GRANTED)
    if target == TRUSTED and separation_of_duties(policy) and (
            _wrote(command.actor.actor_id, command, head) or _wrote(reviewer, command, head)):
        raise AccessDenied("this scope separates duties: an actor never corroborates what it wrote",
                           rule_id=SEPARATION)


def carried_validation(command: UpdateObject, head: ObjectHead, authority: Authority, policy: Any) -> str | None:
    """The validation state an update's new version carries when it is not its head's: `unverified` where the
    updating actor could not have set the head's state itself; None keeps the head's."""
    current = head.state("validation")
    if current == UNVERIFIED:
        return None
    if not authority.holds(_reviewer(command.actor), command.scope_id, VALIDATE):
        return UNVERIFIED
    if current == TRUSTED and separation_of_duties(policy):
        return UNVERIFIED  # the actor wrote these words: corroborated by someone else, never by itself
    return None


def _reviewer(actor: Any) -> str:
    """Whose `validate` a command exercises: its actor's, or under a delegation its principal's (PAMSPEC's
    delegations name PAMSPEC's operations only, so a delegation carries the review power of the actor who
    granted it, never more)."""
    if actor.delegation_id is not None and actor.on_behalf_of_actor_id:
        return str(actor.on_behalf_of_actor_id)
    return str(actor.actor_id)


def _wrote(actor_id: str, command: Any, head: ObjectHead | None) -> bool:
    """Whether `actor_id` wrote the version the command would make trusted: its own new object, or the head
    written by it, for it (a delegation it granted) or naming it as provenance."""
    if isinstance(command, (CreateObject, Promote)) or head is None:
        return True
    meta = head.meta
    actor = meta.get("actor") or {}
    provenance = (meta.get("provenance") or {}).get("actor") or {}
    return actor_id in (actor.get("actor_id"), actor.get("on_behalf_of_actor_id"), provenance.get("actor_id"),
                        provenance.get("on_behalf_of_actor_id"))
