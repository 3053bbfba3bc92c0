"""Local development servers: the NATS and PostgreSQL that `pamledger up|run --local`, the tests and the
benchmarks start from the PyPI wheels, their layout on disk, and the watch that restarts them.

Why apart from the kernel: a deployed service connects to servers it is given and never starts one. Only the
composition root (`pamledger`), the tests and the benchmarks import this package; the services, the SDK and
the MCP binding never do (tests/unit/test_layers.py).
"""
