"""Embedding, a room of the kernel: what turns memory into vectors and keeps them, shared by the indexer
(documents) and search (query text): the space descriptors' embedders, the text profile that says what text
an object contributes, the space registry and each space's vector table (`store`).

It imports only itself, `infra` and `schemas` (tests/unit/test_layers.py).
"""
