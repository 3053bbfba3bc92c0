"""The single writer (service): pure decide, the group-commit shell, the relay to JetStream, verify.

What lives here: core/state/chain (pure), intake, planner, store (the writer's Postgres port), writer (the
shell; it hands committed rows to a callback), relay (committed rows -> JetStream), verify. It may
import only command_handler/, infra/ and schemas/.
"""
