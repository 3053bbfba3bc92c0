"""The Subscribe gateway (service): filters, per-event authorization, cursors, close entries.

What lives here: gateway (requests; writes its ledger entries with infra.requester), feed, session, pump,
filters, store. It may import only subscriptions/, infra/ and schemas/.
"""
