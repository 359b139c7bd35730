"""The Spark connector's AMQP connections with an OAuth 2.0 token (options ``token`` and
``tokenFile``) against the private oauth2 node: a rotated token file reaches a live connection
through ``connection.update-secret`` before the old token expires, with no new connection.
The blocking client is driven directly (no Spark session needed for what is tested here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapter.spark.broker import BlockingBroker, BrokerError
from adapter.spark.options import broker_url
from adapter.spark.streams import StreamOptionError
from tests.cluster.rabbit import RabbitNode
from tests.oauth2.oauth2_node import RESOURCE, TokenIssuer, connection_users
from tests.support import unique, wait_until

NO_CONFIGURE = (f"{RESOURCE}.read:*/*", f"{RESOURCE}.write:*/*")


def test_a_rotated_token_file_reaches_the_live_connection(
    oauth2_node: RabbitNode, issuer: TokenIssuer, tmp_path: Path
) -> None:
    subject = unique("spark")
    token_file = tmp_path / "token"
    token_file.write_text(issuer.mint(subject, ttl=6))
    url = broker_url({"url": f"amqp://127.0.0.1:{oauth2_node.amqp_port}/", "tokenFile": str(token_file)})
    assert "eyJ" not in repr(url)
    with BlockingBroker(url, connection_name="spark token test", timeout=10) as broker:
        broker.queue_declare(
            unique("spark-before"), durable=False, exclusive=False, auto_delete=True, arguments={}
        )
        # the identity agent rotates the file: the new token may not configure anything
        token_file.write_text(issuer.mint(subject, NO_CONFIGURE, ttl=300))
        broker.refresh_token()  # not due yet: nothing sent
        broker.queue_declare(
            unique("spark-still"), durable=False, exclusive=False, auto_delete=True, arguments={}
        )
        time.sleep(4.2)  # a third of the 6-s token's life before its exp: due
        broker.refresh_token()
        assert connection_users(oauth2_node).count(subject) == 1  # the same connection
        with pytest.raises(BrokerError, match="access_refused|ACCESS_REFUSED"):
            broker.queue_declare(
                unique("spark-after"), durable=False, exclusive=False, auto_delete=True, arguments={}
            )
    assert wait_until(lambda: subject not in connection_users(oauth2_node), 10)


def test_token_options_are_checked_on_the_driver(issuer: TokenIssuer, tmp_path: Path) -> None:
    url = "amqp://127.0.0.1:5672/"
    with pytest.raises(StreamOptionError, match="not a JWT"):
        broker_url({"url": url, "token": "hunter2"})
    with pytest.raises(StreamOptionError, match="tokenFile"):
        broker_url({"url": url, "tokenFile": str(tmp_path / "missing")})
    with pytest.raises(StreamOptionError, match="not both"):
        broker_url({"url": url, "token": issuer.mint(), "tokenFile": str(tmp_path / "t")})
    token = issuer.mint()
    parsed = broker_url({"url": url, "token": token})
    assert (parsed.user, parsed.password) == ("", "") and token not in repr(parsed)
