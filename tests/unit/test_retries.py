"""adapter/session/retries.py without a broker: the header's rules, the delay queues, the attempt a
message is at, and the steps of a NACK (the copy, its confirm, then the ack, never the other way
round)."""

from __future__ import annotations

import pytest

from adapter.errors import StompError
from adapter.mapping.budget import Pool
from adapter.mapping.destinations import ProcessingError
from adapter.mapping.operations import (
    AwaitConfirms,
    BasicAck,
    BasicNack,
    BasicPublishMandatory,
    ConfirmSelect,
    Delivery,
    QueueDeclare,
)
from adapter.mapping.properties import MessageProperties
from adapter.session.confirms import Confirms
from adapter.session.retries import Retries, attempts_made, retry_plan, retry_queue
from adapter.session.subscription import Subscription
from adapter.stomp.frame import Frame


class NoReceipts:
    def receipt_of(self, frame: Frame) -> list[object]:
        return []
        yield


def test_the_header_s_rules() -> None:
    plan = retry_plan({"x-retry-delays": "1000, 5000,30000"}, "work", "client-individual")
    assert plan is not None and plan.delays == (1000, 5000, 30000) and plan.dead_letter_exchange is None
    assert retry_plan({}, "work", "auto") is None
    for bad in ("", "1000,", "0", "soon", "86400001", ",".join(["1"] * 33), "-5", "1e3", "١٠"):
        with pytest.raises(ProcessingError):
            retry_plan({"x-retry-delays": bad}, "work", "client-individual")
    for mode in ("auto", "client"):
        with pytest.raises(ProcessingError, match="client-individual"):
            retry_plan({"x-retry-delays": "10"}, "work", mode)


def test_a_delay_queue_dead_letters_back_to_its_queue_and_fits_any_name() -> None:
    declare = retry_queue(5000, "work")
    assert declare.queue == "stomp-retry.5000ms.work" and declare.durable and declare.nowait
    assert declare.arguments == {
        "x-message-ttl": 5000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "work",
        "x-expires": 65000,
    }
    long = retry_queue(1, "q" * 255)
    assert len(long.queue.encode()) <= 255 and long.arguments["x-dead-letter-routing-key"] == "q" * 255


def test_the_attempt_is_how_often_it_came_back_from_a_delay_queue() -> None:
    assert attempts_made(None) == 0
    deaths = [
        {"queue": "stomp-retry.5000ms.work", "reason": "expired", "count": 1},
        {"queue": "stomp-retry.1000ms.work", "reason": "expired", "count": 1},
        {"queue": "work", "reason": "rejected", "count": 3},
    ]
    assert attempts_made({"x-death": deaths}) == 2


def steps_of(
    retries: Retries, frame: Frame, subscription: Subscription, tag: int, nack: bool, confirm: object = True
) -> list[object]:
    generator = retries.settle(frame, subscription, tag, nack)
    steps: list[object] = []
    reply: object = None
    try:
        while True:
            step = generator.send(reply)
            steps.append(step)
            reply = confirm if isinstance(step, AwaitConfirms) else None
    except StopIteration:
        return steps


def setup() -> tuple[Retries, Confirms, Subscription]:
    confirms = Confirms()
    retries = Retries(confirms, NoReceipts(), Pool(10**6, "adapter.pool", "Bytes").account(10**6, "a", "m"))  # type: ignore[arg-type]
    plan = retry_plan({"x-retry-delays": "100,200"}, "work", "client-individual")
    subscription = Subscription(
        "T_s", "s", "/amq/queue/work", None, "client-individual", retry=plan, hook=retries
    )
    return retries, confirms, subscription


def delivery(tag: int, headers: dict[str, object] | None = None) -> Delivery:
    return Delivery(
        "T_s", tag, False, "", "work", MessageProperties(headers=headers, expiration="60000"), b"body"
    )


def test_a_nack_publishes_the_copy_waits_for_its_confirm_then_acks() -> None:
    retries, confirms, subscription = setup()
    retries.rendered(subscription, delivery(7), False)
    steps = steps_of(retries, Frame("NACK", {"id": "x"}), subscription, 7, nack=True)
    declare, select, publish, wait, ack = steps
    assert isinstance(declare, QueueDeclare) and declare.queue == "stomp-retry.100ms.work"
    assert isinstance(select, ConfirmSelect) and isinstance(wait, AwaitConfirms)
    assert isinstance(publish, BasicPublishMandatory) and publish.routing_key == "stomp-retry.100ms.work"
    assert publish.properties.expiration is None and publish.body == b"body"  # the delay is the queue's
    assert ack == BasicAck(7, False)


def test_a_refused_copy_is_an_error_and_the_original_is_not_acked() -> None:
    retries, confirms, subscription = setup()
    retries.rendered(subscription, delivery(7), False)
    generator = retries.settle(Frame("NACK", {"id": "x"}), subscription, 7, True)
    steps = [next(generator), next(generator), next(generator), next(generator)]
    assert isinstance(steps[-1], AwaitConfirms)
    confirms.settle(1, False, False)  # the broker's basic.nack of the copy
    with pytest.raises(StompError, match="did not confirm"):
        generator.send(True)


def test_a_returned_copy_is_an_error_and_the_original_is_not_acked() -> None:
    """The copy is mandatory and waited for (``outstanding``); the broker returned it (a delay
    queue gone since its declare, a dead-letter exchange bound to no queue)."""
    retries, confirms, subscription = setup()
    retries.rendered(subscription, delivery(7), False)
    generator = retries.settle(Frame("NACK", {"id": "x"}), subscription, 7, True)
    steps = [next(generator), next(generator), next(generator), next(generator)]
    publish, wait = steps[2:]
    assert isinstance(publish, BasicPublishMandatory) and isinstance(wait, AwaitConfirms)
    assert confirms.outstanding  # the shell's AwaitConfirms waits for the copy's confirm
    confirms.returned += 1  # the broker's basic.return, then its basic.ack
    confirms.settle(1, False, True)
    with pytest.raises(StompError, match="could not route"):
        generator.send(True)


def test_after_the_last_delay_the_queue_dead_letters_it() -> None:
    retries, _, subscription = setup()
    back_twice = {
        "x-death": [
            {"queue": "stomp-retry.200ms.work", "reason": "expired", "count": 1},
            {"queue": "stomp-retry.100ms.work", "reason": "expired", "count": 1},
        ]
    }
    retries.rendered(subscription, delivery(9, back_twice), False)
    assert steps_of(retries, Frame("NACK", {"id": "x"}), subscription, 9, nack=True) == [
        BasicNack(9, False, False)
    ]


def test_an_ack_and_a_sweep_give_the_kept_bytes_back() -> None:
    retries, _, subscription = setup()
    for tag in (1, 2, 3):
        retries.rendered(subscription, delivery(tag), False)
    assert steps_of(retries, Frame("ACK", {"id": "x"}), subscription, 1, nack=False) == [BasicAck(1, False)]
    retries.swept(2)
    retries.forget("T_s")
    assert retries._account.held == 0


def test_the_default_per_destination_prefix() -> None:
    from adapter.config import ConfigError, load_settings
    from adapter.session.retries import default_delays

    settings = load_settings(None, {"default_retry_delays": "/queue/orders.=1000,5000; /queue/orders.eu=10"})
    defaults = settings.default_retry_delays
    assert defaults == (("/queue/orders.", "1000,5000"), ("/queue/orders.eu", "10"))
    assert default_delays("/queue/orders.eu.1", "client-individual", defaults) == "10"  # the longest prefix
    assert default_delays("/queue/orders.us", "client-individual", defaults) == "1000,5000"
    assert default_delays("/queue/orders.us", "client", defaults) is None  # only client-individual
    assert default_delays("/queue/other", "client-individual", defaults) is None
    for bad in ("/queue/x", "/queue/x=", "queue/x=10", "/queue/x=0", "/queue/x=ten"):
        with pytest.raises(ConfigError, match="PREFIX=DELAYS"):
            load_settings(None, {"default_retry_delays": bad})
