"""Sink transports for the in-process micro-benchmarks (bench/micro.py, bench/tapmicro.py): what
a protocol object writes to them goes nowhere, so a benchmark times the Python per message and
no socket.  They offer just what the adapter's and the tap's protocols call on a transport."""

from __future__ import annotations


class Sink:
    """A transport that keeps nothing; ``peer`` is what it says its peer is."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> None:
        self._peer = peer

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._peer if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return False  # the adapter then closes at once instead of half-closing

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class CountingSink(Sink):
    """A sink that counts the bytes and the writes it is given."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> None:
        super().__init__(peer)
        self.bytes = 0
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        self.writes += 1
