"""First end-to-end check: connect, send with receipt, receive, disconnect."""

from tests.support import unique


def test_send_receive_roundtrip(stomp_client, broker):
    client = stomp_client("1.2")
    queue = unique("smoke")
    broker.track_queue(queue)
    client.conn.subscribe(f"/queue/{queue}", id="s1", ack="auto", headers={"receipt": "sub"})
    assert client.next("RECEIPT").headers["receipt-id"] == "sub"
    client.conn.send(f"/queue/{queue}", "hello", headers={"receipt": "r1", "durable": "false"})
    assert client.next("RECEIPT").headers["receipt-id"] == "r1"
    message = client.next("MESSAGE")
    assert message.body == "hello"
    assert message.headers["destination"] == f"/queue/{queue}"
    assert message.headers["subscription"] == "s1"


def test_subscribe_receipt_comes_before_waiting_messages(stomp_client):
    # the plugin finishes a SUBSCRIBE (consume, bind, RECEIPT) before it delivers; RabbitMQ's
    # own test suite (destinations.py, durable subscriptions) checks that order
    producer = stomp_client("1.2")
    topic = unique("waiting")
    producer.conn.subscribe(f"/topic/{topic}", id="d", headers={"durable": "true", "auto-delete": "false"})
    producer.conn.unsubscribe("d", headers={"receipt": "u"})
    assert producer.next("RECEIPT").headers["receipt-id"] == "u"
    for i in range(3):
        producer.conn.send(f"/topic/{topic}", f"m{i}", headers={"receipt": f"s{i}"})
        producer.next("RECEIPT")
    consumer = stomp_client("1.2")
    consumer.next("CONNECTED")
    consumer.conn.subscribe(
        f"/topic/{topic}", id="d", headers={"durable": "true", "auto-delete": "false", "receipt": "sub"}
    )
    first = consumer.next()
    assert (first.command, first.headers.get("receipt-id")) == ("RECEIPT", "sub")
    assert [m.body for m in consumer.messages(3)] == ["m0", "m1", "m2"]
    consumer.conn.unsubscribe("d", headers={"durable": "true", "receipt": "gone"})
    assert consumer.next("RECEIPT").headers["receipt-id"] == "gone"


def test_large_binary_bodies_arrive_intact(stomp_client, broker):
    # 3 MiB spans many AMQP body frames (frame_max 128 KiB) and many socket reads on both sides;
    # NUL and newline bytes inside must survive because content-length is used
    client = stomp_client("1.2", auto_decode=False)
    queue = unique("large")
    broker.track_queue(queue)
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    client.next("RECEIPT")
    bodies = [bytes(range(256)) * (3 * 4096), b"\0\n\0" * 100_001, b""]
    for i, body in enumerate(bodies):
        client.conn.send(f"/queue/{queue}", body, headers={"receipt": f"r{i}"})
    received = [client.next("MESSAGE", timeout=15).body for _ in bodies]
    assert [len(b) for b in received] == [len(b) for b in bodies]
    assert received == bodies
