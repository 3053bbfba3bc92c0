"""The query service: Read, Inspect History and Query, with consistency tokens.

What lives here: reads (authoritative state), plan/cursor/search (Query over the projection), service
(the NATS handlers). It may import only query/, infra/ and schemas/.
"""
