"""Authorization, a room of the kernel: credentials and tokens, the one decision function, the grants read
model, the denial audit and the NATS users and permissions a credential gets (docs/security.md).

Services reach it through the `Policy` port of `infra.request_shell` (`holds`, `administers`); it imports only
itself, `infra` and `schemas` (tests/unit/test_layers.py).
"""
