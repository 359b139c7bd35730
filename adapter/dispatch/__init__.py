"""The queue dispatcher of selector subscriptions on a queue (activemq profile): the pure rules
(rules.py: routing, credit, parking; imports no asyncio) beside their asyncio runtime
(runtime.py: a connection's side of the dispatchers, its coalesced acks)."""
