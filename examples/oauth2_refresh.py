"""A STOMP client that logs in with an OAuth 2.0 token and refreshes it inside its session.

    python -m examples.oauth2_refresh --key signing-key.pem --port 61613

``--key`` is the private half of the key the broker trusts (``auth_oauth2.signing_keys.<kid>``);
a real client gets its tokens from its identity provider instead of minting them.  The client
subscribes, then every two seconds sends a message and refreshes its token (a SEND to
``/auth/token`` whose body is the new token, with a receipt): the subscription, and the
messages on their way, carry on through every refresh.  README.md, "OAuth 2.0", has the
broker's configuration.  Needs stomp.py and PyJWT (``pip install stomp.py 'PyJWT[crypto]'``).
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

import jwt
import stomp


def mint(private_key: bytes, kid: str, subject: str, ttl: float) -> str:
    now = time.time()
    claims = {
        "sub": subject,
        "aud": ["rabbitmq"],
        "scope": "rabbitmq.configure:*/* rabbitmq.read:*/* rabbitmq.write:*/*",
        "iat": int(now),
        "exp": int(now + ttl),
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, private_key, algorithm="RS256", headers={"kid": kid})


class Printer(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.receipts: dict[str, threading.Event] = {}

    def on_message(self, frame: stomp.utils.Frame) -> None:
        print("MESSAGE", frame.body)

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        self.receipts.setdefault(frame.headers["receipt-id"], threading.Event()).set()

    def on_error(self, frame: stomp.utils.Frame) -> None:
        print("ERROR", frame.headers.get("message"), frame.body)

    def wait(self, receipt: str) -> None:
        if not self.receipts.setdefault(receipt, threading.Event()).wait(5):
            raise SystemExit(f"no RECEIPT {receipt}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--key", required=True, help="PEM file of the signing key's private half")
    parser.add_argument("--kid", default="stomp-key", help="the key's id (auth_oauth2.signing_keys.<kid>)")
    parser.add_argument("--port", type=int, default=61613)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with open(args.key, "rb") as file:
        key = file.read()
    printer = Printer()
    conn = stomp.Connection12([("127.0.0.1", args.port)], vhost="/")
    conn.set_listener("printer", printer)
    # a short-lived token: without the refreshes below the adapter would end the session at exp
    conn.connect("", mint(key, args.kid, "example-app", ttl=10), wait=True)
    conn.subscribe("/queue/oauth2-example", id="1", ack="auto")
    for number in range(args.rounds):
        conn.send("/queue/oauth2-example", f"message {number}", receipt=f"m{number}")
        printer.wait(f"m{number}")
        conn.send("/auth/token", mint(key, args.kid, "example-app", ttl=10), receipt=f"t{number}")
        printer.wait(f"t{number}")
        print("token refreshed", number + 1)
        time.sleep(2)
    conn.disconnect()


if __name__ == "__main__":
    main()
