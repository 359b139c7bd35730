"""adapter/migrate/recording.py and the replay's bodies, without a broker: a client frame whose
body the tap left out for its size (``omitted``, docs/recording-format.md) does not make a
recording unusable for the replay, and is replayed with as many filler bytes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from adapter.migrate.recording import RecordingError, load_conversations
from adapter.migrate.replay import _body_of


def write(directory: Path, records: list[dict[str, object]]) -> None:
    with gzip.open(directory / "c-1.jsonl.gz", "wt", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


def frame(body_len: int, **more: object) -> dict[str, object]:
    return {
        "kind": "frame",
        "ts": 1.0,
        "conn": "c1",
        "dir": "in",
        "command": "SEND",
        "headers": [["destination", "/queue/q"]],
        "body_len": body_len,
        **more,
    }


def test_a_body_left_out_for_its_size_is_replayed_as_filler(tmp_path: Path) -> None:
    write(tmp_path, [frame(20_000_000, omitted=["body"]), frame(2, body="aGk=")])
    big, small = load_conversations(tmp_path, need_bodies=True)
    assert big.omitted == ("body",) and big.body is None
    assert _body_of(big) == b"x" * 20_000_000 and _body_of(small) == b"hi"


def test_a_recording_without_bodies_is_still_refused(tmp_path: Path) -> None:
    write(tmp_path, [frame(5)])
    with pytest.raises(RecordingError, match="--record-bodies"):
        load_conversations(tmp_path, need_bodies=True)
