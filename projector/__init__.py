"""The projector (service): a follower of the ledger stream keeping the current-version tables.

What lives here: rows (pure projection), store (writing rows and checkpoint in one transaction), step
(the apply step the kernel follower runs: `infra.follower`), replay and audit. It may import only
projector/, infra/ and schemas/.
"""
