"""``python -m adapter``: the same as the ``stomp-amqp-adapter`` command."""

from .cli import run

run()
