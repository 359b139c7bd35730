"""First end-to-end check: connect, send with receipt, receive, disconnect."""

from tests.support import unique


def test_send_receive_roundtrip(stomp_client):
    client = stomp_client("1.2")
    queue = unique("smoke")
    client.conn.subscribe(f"/queue/{queue}", id="s1", ack="auto", headers={"receipt": "sub"})
    assert client.next("RECEIPT").headers["receipt-id"] == "sub"
    client.conn.send(f"/queue/{queue}", "hello", headers={"receipt": "r1", "durable": "false"})
    assert client.next("RECEIPT").headers["receipt-id"] == "r1"
    message = client.next("MESSAGE")
    assert message.body == "hello"
    assert message.headers["destination"] == f"/queue/{queue}"
    assert message.headers["subscription"] == "s1"
