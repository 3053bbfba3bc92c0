"""The indexer (service, later issues): Embedding Spaces kept in step with the ledger.

It may import only indexer/, infra/ and schemas/.
"""
