"""The Python SDK (async and sync clients) and the client half of the `pamledger` CLI.

It speaks NATS only: it may import memory_client/, infra/ and schemas/, never a service or the
composition root (pamledger/).
"""
