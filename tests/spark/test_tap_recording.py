"""A recording of the tap is read by Spark as it is: ``spark.read.json(DIR)`` (docs/recording-format.md)."""

from __future__ import annotations

import socket

from tests.tap_support import ScriptedUpstream, TapProcess, recv_all


def test_spark_reads_a_recording_directory_as_it_is(spark, tmp_path):
    def script(conn: socket.socket, up: ScriptedUpstream) -> None:
        up.read_until(conn, b"\0")
        up.send(conn, b"CONNECTED\nversion:1.1\n\n\0\n")
        up.read_to_end(conn)

    upstream = ScriptedUpstream(script)
    record = tmp_path / "rec"
    tap = TapProcess(upstream.address, record)
    try:
        with socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client:
            client.sendall(
                b"CONNECT\naccept-version:1.1\nlogin:billing\npasscode:pw\nclient-id:legacy-7\n\n\0\n"
            )
            client.sendall(b"SUBSCRIBE\ndestination:/topic/a\nselector:x = 1\nid:1\n\n\0\n")
            client.sendall(b"SEND\ndestination:/queue/b\ncontent-length:3\n\nabc\0\n\n\n")
            client.shutdown(socket.SHUT_WR)
            assert recv_all(client).startswith(b"CONNECTED")
        upstream.join()
    finally:
        assert tap.stop() == 0
    # a file the tap did not finish (a crash, a full disk) is hidden: Spark must not read it
    (record / ".tap-19700101T000000Z-1-000009.jsonl.gz.part").write_bytes(b"\x1f\x8b not gzip")

    rows = spark.read.json(str(record))
    assert dict(rows.dtypes)["headers"] == "array<array<string>>"
    by_kind = {row["kind"]: row["count"] for row in rows.groupBy("kind").count().collect()}
    assert by_kind == {"open": 1, "frame": 4, "heartbeats": 1, "close": 1}
    frames = (
        rows.where("kind = 'frame'").orderBy("ts").select("dir", "command", "headers", "body_len").collect()
    )
    # in order per direction (how the two directions interleave depends on the scheduling)
    assert [(f["command"], f["body_len"]) for f in frames if f["dir"] == "in"] == [
        ("CONNECT", 0),
        ("SUBSCRIBE", 0),
        ("SEND", 3),
    ]
    assert [f["command"] for f in frames if f["dir"] == "out"] == ["CONNECTED"]
    connect = dict((name, value) for name, value in frames[0]["headers"])
    assert (connect["login"], connect["client-id"], connect["passcode"]) == ("billing", "legacy-7", "***")
    (close,) = rows.where("kind = 'close'").select("by", "bytes_in", "bytes_out").collect()
    assert close["by"] == "client" and close["bytes_out"] == len(b"CONNECTED\nversion:1.1\n\n\0\n")
