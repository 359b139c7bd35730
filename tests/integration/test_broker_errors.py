"""Broker-side refusals reach the STOMP client as the plugin reports them (docs/behaviour.md#error-handling;
docs/behaviour.md#authentication).

RabbitMQ's own permission checks apply because every client acts with its own credentials: a
user with limited permissions is created through the management API for these tests.
"""

from __future__ import annotations

import urllib.parse
import urllib.request

import pytest

from tests.support import BrokerProbe, StompClient, unique


@pytest.fixture
def limited_user(broker: BrokerProbe) -> str:
    """A user who may configure only queues named perm-ok-*, and publish to amq.topic only
    with routing keys 'allowed.*'."""
    user = broker.create_user(
        "secret",
        prefix="stomp-limited",
        permissions={"configure": "^perm-ok-.*", "write": ".*", "read": ".*"},
    )
    broker.management(
        f"/api/topic-permissions/%2F/{urllib.parse.quote(user, safe='')}",
        "PUT",
        {"exchange": "amq.topic", "write": "^allowed\\.", "read": ".*"},
    )
    return user


def test_declare_without_configure_permission_is_access_refused(adapter, limited_user):
    client = StompClient(adapter.port, login=limited_user, passcode="secret")
    client.conn.subscribe("/queue/forbidden-q", id="s", headers={"receipt": "r"})
    error = client.next("ERROR")
    assert error.headers["message"] == "access_refused"
    assert error.body.startswith("ACCESS_REFUSED - access to queue 'forbidden-q' in vhost '/' refused")
    assert client.wait_disconnected(5)


def test_topic_publish_denied_by_topic_permission(adapter, limited_user):
    client = StompClient(adapter.port, login=limited_user, passcode="secret")
    client.conn.send("/topic/denied.key", "x", headers={"receipt": "never"})
    error = client.next("ERROR")
    assert error.headers["message"] == "access_refused"
    assert "ACCESS_REFUSED" in error.body and "denied.key" in error.body
    assert client.wait_disconnected(5)
    assert all(f.command != "RECEIPT" for f in client._pending)


def test_topic_publish_allowed_by_topic_permission(adapter, limited_user):
    client = StompClient(adapter.port, login=limited_user, passcode="secret")
    client.conn.send("/topic/allowed.key", "x", headers={"receipt": "ok"})
    assert client.next("RECEIPT").headers["receipt-id"] == "ok"
    client.close()


def test_queue_deleted_under_a_subscription(stomp_client, amqp_url):
    client = stomp_client("1.2")
    queue, other = unique("doomed"), unique("after-cancel")
    probe = BrokerProbe(amqp_url)
    probe.track_queue(other)
    try:
        client.conn.subscribe(f"/queue/{queue}", id="s1", headers={"receipt": "sub"})
        assert client.next("RECEIPT").headers["receipt-id"] == "sub"
        probe.delete_queue(queue)
        error = client.next("ERROR")
        assert error.headers["message"] == "Server cancelled subscription"
        assert error.headers["subscription"] == "s1"
        assert "No more messages will be delivered for \"id='s1'\"" in error.body
        # not the client's fault: the connection stays usable, as with the plugin
        client.conn.subscribe(f"/queue/{other}", id="s2")
        client.conn.send(f"/queue/{other}", "still works")
        assert client.next("MESSAGE").body == "still works"
    finally:
        probe.close()


def test_failed_bind_deletes_the_subscription_queue(adapter, broker):
    # docs/destinations.md#common-steps: when consume or bind fails, the plugin deletes the subscription
    # queue it
    # declared (on a fresh channel); a durable one would otherwise stay forever
    from adapter.mapping.destinations import subscription_queue_name

    sub_id, exchange = unique("sub"), unique("missing-exchange")
    queue = subscription_queue_name("k", sub_id)
    broker.track_queue(queue)
    client = StompClient(adapter.port)
    client.conn.subscribe(
        f"/exchange/{exchange}/k",
        id=sub_id,
        headers={"durable": "true", "auto-delete": "false", "receipt": "r"},
    )
    error = client.next("ERROR")
    assert error.headers["message"] == "not_found"
    assert error.body.startswith(f"NOT_FOUND - no exchange '{exchange}'")
    assert client.wait_disconnected(5)
    assert broker.wait_gone(queue), f"subscription queue {queue} left behind"


def test_a_user_at_its_channel_limit_gets_the_error_at_its_first_channel_frame(adapter, broker):
    """The AMQP channel opens with the first frame that needs it (docs/compatibility.md), so a
    user at RabbitMQ's max-channels limit gets CONNECTED, then ERROR not_allowed for that frame,
    and no RECEIPT; the plugin refuses the CONNECT instead."""
    user = broker.create_user("secret", prefix="stomp-no-channels")
    broker.management(
        f"/api/user-limits/{urllib.parse.quote(user, safe='')}/max-channels", "PUT", {"value": 0}
    )
    queue = unique("no-channel")
    broker.track_queue(queue)
    client = StompClient(adapter.port, login=user, passcode="secret")
    client.conn.send(f"/queue/{queue}", "x", headers={"receipt": "never"})
    error = client.next("ERROR")
    assert error.headers["message"] == "not_allowed"
    assert "number of channels opened" in error.body
    assert client.wait_disconnected(5)
    assert all(f.command != "RECEIPT" for f in client._pending)
