"""The composition root: the only package that assembles roles.

What lives here: the role runtime (runtime.py: which services run in a process, their leadership loops),
the supervisor of `pamledger run` (one child process per role), and the `pamledger` CLI's server and admin
commands (run, serve, up, down, clean, status, verify, stream, replay, audit), which hand client commands
to pamledger_client.cli. It may import everything below it: the services, the SDK, infra/ and schemas/;
nothing imports it (bench/ and tests/ aside).
"""
