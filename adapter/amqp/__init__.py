"""The only package with an AMQP socket: the per-client broker connection and its wire format."""
