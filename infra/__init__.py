"""The kernel the services share: ledger rows and reads, projection tables, plumbing, settings.

What lives here: the ledger vocabulary and its reads (ledger), projection table names and the checkpoint
read (projections), the one checkpointed follower of the ledger stream (follower), writer commands over
NATS for services (requester), settings, logging, migrations, NATS and Postgres plumbing, ledger
identity, stuck-follower state, local servers and process helpers.
It may import only infra/ and schemas/ (never a service, the SDK or the composition root).
"""
