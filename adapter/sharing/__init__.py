"""Shared topic subscriptions (adapter.shared_subscriptions): the pure rules (rules.py: who
shares, one rendering per delivery, the lag bounds; imports no asyncio) beside their asyncio
runtime (runtime.py: the hubs' AMQP connections and the members' sockets)."""
