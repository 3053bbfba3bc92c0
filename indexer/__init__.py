"""The indexer (service): the second follower of the ledger stream, keeping every Embedding Space's vectors
in step with the current versions (embeds, moves, erases), filling new spaces, and telling the ledger what
it embedded through an outbox.

It may import only indexer/, infra/ and schemas/.
"""
