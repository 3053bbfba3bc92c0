"""The writer's pure core: commands in, decisions and the batch's rows out, no I/O.

`intake` parses and checks a command's bytes, `decide` (with `versions`, `relationships`, `redactions`,
`promotion`, `tool_memory`, `delegations`, `references`) decides one command against the state it names,
`planner` folds a batch of them into one `Batch` (`batch`: the rows, the `LedgerStore` port and the rules
every store applies), `chain` links rows by hash, `state` holds the values they pass around.

The shell around it (command_handler/: `writer`, `stamps` for ids and time, `denials`, `guard`, `store` and
`store_reads` on Postgres, `memory_store` in memory, `relay`, `verify`) does the I/O. A test keeps the rule:
no module here imports an I/O library or a module of the shell (tests/unit/test_layers.py), and the core's
tests run without Postgres or NATS (tests/unit/test_plan_batch.py, test_writer_core_fast.py,
test_ledger_store_memory.py).
"""
