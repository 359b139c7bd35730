"""Which recorded connections the replay must keep in order with each other (pure, no I/O).

Owns the grouping behind the replay's ordering model (replay.py): two connections are related
when the recording shows that what one does can change what the other gets, and the related
groups are the connected components of that relation (a union-find over connections and the
names they share).  The replay keeps the recorded order inside a group and runs the groups
concurrently, so its time follows the recording's span, not its number of connections.

What relates two connections (each is a name both touch):

* a destination: one SENDs to it, SUBSCRIBEs to it, or received a MESSAGE from it (the
  recorded MESSAGE's ``destination``, so a wildcard subscriber meets the concrete topics it was
  given); the parts of a composite destination (``/queue/a,/topic/b``) each count;
* a ``reply-to``: of a SEND (the requester) and of a recorded MESSAGE (the responder, who sends
  to it); ActiveMQ's ``/remote-temp-queue/...`` names are global;
* a ``client-id`` (a durable subscriber and the next connection with its client-id);
* a virtual topic: ``/topic/VirtualTopic.X`` and each consumer group's
  ``/queue/Consumer.G.VirtualTopic.X`` are one name;
* a topic wildcard (``*``, ``>``) subscribed to and each recorded concrete topic it matches;
* the dead-letter queue, only when a connection of the recording reads one (``ActiveMQ.DLQ``,
  ``DLQ.*``): it is related to every connection that NACKs or SENDs with ``expires``.

``/temp-queue/X`` and ``/temp-topic/X`` belong to the connection that names them (ActiveMQ's
temporary destinations are per connection), so one name used by many connections relates none
of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from .recording import Event

__all__ = [
    "destination_names",
    "destinations_reached",
    "name_components",
    "related_groups",
    "split_by_group",
    "topic_matches",
]

_TEMPORARY: Final = ("/temp-queue/", "/temp-topic/")
_VIRTUAL_TOPIC: Final = "/topic/VirtualTopic."
_VIRTUAL_CONSUMER: Final = "/queue/Consumer."
_TOPIC: Final = "/topic/"


def destination_names(conn: str, destination: str) -> list[str]:
    """The names a recorded ``destination`` header stands for, as the grouping compares them."""
    names = []
    for part in destination.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith(_TEMPORARY):
            names.append(f"{conn} {part}")  # only this connection's
        elif part.startswith(_VIRTUAL_CONSUMER):
            _, _, rest = part[len(_VIRTUAL_CONSUMER) :].partition(".")
            if rest.startswith("VirtualTopic.") and rest != "VirtualTopic.":
                names.append(_TOPIC + rest)
            else:
                names.append(part)
        else:
            names.append(part)
    return names


def topic_matches(pattern: str, topic: str) -> bool:
    """Whether ActiveMQ's topic wildcard ``pattern`` (``*``: one word, ``>``: the rest) matches
    ``topic`` (both without the ``/topic/`` prefix, words separated by dots)."""
    words = topic.split(".")
    for position, word in enumerate(pattern.split(".")):
        if word == ">":
            return position < len(words)
        if position >= len(words) or (word != "*" and word != words[position]):
            return False
    return len(pattern.split(".")) == len(words)


def _is_wildcard(name: str) -> bool:
    return name.startswith(_TOPIC) and any(word in ("*", ">") for word in name[len(_TOPIC) :].split("."))


def _is_dead_letter_queue(name: str) -> bool:
    return name.startswith(("/queue/ActiveMQ.DLQ", "/queue/DLQ."))


_DEAD_LETTERS: Final = "dead letters"


class _UnionFind:
    """Disjoint sets of names (union by size, path halving: no recursion, near-constant time)."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        self.size: dict[str, int] = {}

    def find(self, node: str) -> str:
        parent = self.parent.setdefault(node, node)
        while parent != node:
            grandparent = self.parent[parent]
            self.parent[node] = grandparent
            node, parent = grandparent, self.parent[grandparent]
        return node

    def union(self, first: str, second: str) -> None:
        a, b = self.find(first), self.find(second)
        if a == b:
            return
        if self.size.get(a, 1) < self.size.get(b, 1):
            a, b = b, a
        self.parent[b] = a
        self.size[a] = self.size.get(a, 1) + self.size.get(b, 1)


def _names(event: Event) -> Iterable[str]:
    """The names one recorded frame relates its connection to."""
    command = event.command
    if event.direction == "in":
        if command in ("SEND", "SUBSCRIBE"):
            destination = event.header("destination")
            if destination is not None:
                yield from destination_names(event.conn, destination)
            reply_to = event.header("reply-to")
            if reply_to is not None:
                yield from destination_names(event.conn, reply_to)
        elif command in ("CONNECT", "STOMP"):
            client_id = event.header("client-id")
            if client_id:
                yield f"client-id {client_id}"
    elif command == "MESSAGE":
        for header in ("destination", "reply-to"):
            value = event.header(header)
            if value is not None:
                yield from destination_names(event.conn, value)


def _sends_dead_letters(event: Event) -> bool:
    if event.direction != "in":
        return False
    if event.command == "NACK":
        return True
    return event.command == "SEND" and (event.header("expires") or "0") not in ("", "0")


def related_groups(events: Sequence[Event]) -> list[list[str]]:
    """The recorded connections in groups of related ones (see the module's docstring): each
    group in the order of its connections' first frames, the groups in the order of their first
    frames."""
    union = _UnionFind()
    order: dict[str, None] = {}
    topics: set[str] = set()
    wildcards: set[str] = set()
    dead_letter_readers = False
    dead_letter_senders: set[str] = set()
    for event in events:
        if event.kind != "frame":
            continue
        conn_node = f"conn {event.conn}"
        if event.conn not in order:
            order[event.conn] = None
            union.find(conn_node)
        for name in _names(event):
            node = f"name {name}"
            union.union(conn_node, node)
            if _is_wildcard(name):
                wildcards.add(name)
            elif name.startswith(_TOPIC):
                topics.add(name)
            if _is_dead_letter_queue(name):
                dead_letter_readers = True
                union.union(node, _DEAD_LETTERS)
        if _sends_dead_letters(event):
            dead_letter_senders.add(conn_node)
    for pattern in wildcards:
        for topic in topics:
            if topic_matches(pattern[len(_TOPIC) :], topic[len(_TOPIC) :]):
                union.union(f"name {pattern}", f"name {topic}")
    if dead_letter_readers:
        for conn_node in dead_letter_senders:
            union.union(conn_node, _DEAD_LETTERS)
    groups: dict[str, list[str]] = {}
    for conn in order:
        groups.setdefault(union.find(f"conn {conn}"), []).append(conn)
    return list(groups.values())


def name_components(events: Sequence[Event]) -> dict[str, str]:
    """Each destination name the recording's SENDs and SUBSCRIBEs use, mapped to the name that
    stands for all the names a message can cross between: a topic wildcard and the concrete
    topics it matches (a virtual topic and its consumer queues are one name already).  The
    replay uses it to tell which subscriber's end a SEND or SUBSCRIBE must wait for."""
    union = _UnionFind()
    topics: set[str] = set()
    wildcards: set[str] = set()
    for event in events:
        if event.kind != "frame" or event.direction != "in" or event.command not in ("SEND", "SUBSCRIBE"):
            continue
        for name in destination_names(event.conn, event.header("destination") or ""):
            union.find(name)
            if _is_wildcard(name):
                wildcards.add(name)
            elif name.startswith(_TOPIC):
                topics.add(name)
    for pattern in wildcards:
        for topic in topics:
            if topic_matches(pattern[len(_TOPIC) :], topic[len(_TOPIC) :]):
                union.union(pattern, topic)
    return {name: union.find(name) for name in union.parent}


def destinations_reached(components: dict[str, str], conn: str, destination: str) -> set[str]:
    """The components (``name_components``) a ``destination`` header of ``conn`` touches."""
    return {components.get(name, name) for name in destination_names(conn, destination)}


def split_by_group(events: Sequence[Event], groups: Sequence[Sequence[str]]) -> list[list[Event]]:
    """``events`` split by group (the order kept inside each); a connection in no group (only a
    close recorded) goes nowhere."""
    group_of = {conn: index for index, members in enumerate(groups) for conn in members}
    split: list[list[Event]] = [[] for _ in groups]
    for event in events:
        index = group_of.get(event.conn)
        if index is not None:
            split[index].append(event)
    return split
