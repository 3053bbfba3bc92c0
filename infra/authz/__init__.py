"""Authorization: credentials, grants, the one decision function and the denial audit (docs/security.md)."""
