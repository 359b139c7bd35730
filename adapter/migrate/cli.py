"""Command line of the migration toolkit: ``report`` (the Spark job) and ``replay``.

Owns the arguments, the SparkSession of ``report`` (``local[*]`` unless ``--master`` or
spark-submit says otherwise), the replay's signal handling (SIGINT and SIGTERM end it with the
summary of what it replayed) and the exit statuses: 0 done (replay: no difference), 1 replay
found differences, 2 the command could not run (bad arguments, no PySpark, a recording without
bodies for replay, a replay whose first logins were all refused), 128 + the signal's number for
a replay interrupted by SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .progress import Output, Summary
    from .replay import Replayer

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m adapter.migrate",
        description="Plan and rehearse moving recorded ActiveMQ STOMP traffic onto RabbitMQ "
        "(docs/migration-activemq.md, 'Planning a migration').",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="the migration report of a recording (a Spark job)")
    report.add_argument("recording", help="the recording directory the tap wrote (a path Spark can read)")
    report.add_argument("--out", help="write the report as one HTML page here")
    report.add_argument("--json", dest="json_out", help="write the report's data as JSON here")
    report.add_argument(
        "--master", help="Spark master URL (default: spark-submit's, or local[*] when run with python)"
    )
    replay = commands.add_parser("replay", help="replay a recording's clients against an adapter")
    replay.add_argument("recording", help="the recording directory (made with --record-bodies)")
    replay.add_argument("--target", required=True, help="HOST:PORT of an adapter in the activemq profile")
    replay.add_argument(
        "--speed", type=float, default=1.0, help="replay N times faster than recorded; 0: without pauses"
    )
    replay.add_argument("--login", help="log every connection in as this user (default: the recorded login)")
    replay.add_argument(
        "--passcode",
        default=os.environ.get("STOMP_MIGRATE_PASSCODE"),
        help="passcode of every CONNECT (recordings never hold passcodes); "
        "default: the variable STOMP_MIGRATE_PASSCODE",
    )
    replay.add_argument(
        "--vhost", help="replace the CONNECT frames' host header (RabbitMQ reads it as the vhost)"
    )
    replay.add_argument(
        "--wait", type=float, default=5.0, help="seconds to wait for an answer the upstream gave (default 5)"
    )
    replay.add_argument(
        "--stop-after-refused-logins",
        type=int,
        default=3,
        metavar="N",
        help="stop when the first N logins are all refused by the target (default 3; 0: never stop); "
        "the usual cause is a missing --passcode",
    )
    replay.add_argument(
        "--json",
        dest="json_out",
        nargs="?",
        const="-",
        metavar="FILE",
        help="without FILE (or with -): each connection's result as one JSON line on stdout when the "
        "connection ends, then a summary line; with FILE: also the results as one JSON array there",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "report":
        return _report(args)
    return _replay(args)


def _report(args: argparse.Namespace) -> int:
    if not args.out and not args.json_out:
        print("report: give --out FILE.html, --json FILE.json or both", file=sys.stderr)
        return 2
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("report needs PySpark: pip install 'stomp-amqp-adapter[spark]'", file=sys.stderr)
        return 2
    from .page import render
    from .report import build_report

    if "PYSPARK_GATEWAY_PORT" not in os.environ and (args.master is None or args.master.startswith("local")):
        # Spark's Python workers on this machine run ``python3`` from the PATH unless told
        # otherwise, often another interpreter than this one (a virtualenv's), without this
        # package: they run this one.  Not under spark-submit (it set the gateway up and says
        # which Python its executors run) and not for another master (its hosts have their own).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("stomp-amqp-adapter migration report")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        began = time.monotonic()
        document = build_report(spark, args.recording)
        document["totals"]["report_seconds"] = round(time.monotonic() - began, 1)
    finally:
        spark.stop()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    if args.out:
        Path(args.out).write_text(render(document))
    totals = document["totals"]
    print(
        f"{totals['frames']} frames, {totals['connections']} connections,"
        f" {totals['applications']} applications,"
        f" {len(document['idioms'])} idioms in {totals['report_seconds']} s"
        + "".join(f"; wrote {name}" for name in (args.out, args.json_out) if name)
    )
    return 0


def _replay(args: argparse.Namespace) -> int:
    from .progress import Output
    from .recording import RecordingError, load_conversations
    from .replay import Replayer, ReplayOptions

    host, _, port = args.target.rpartition(":")
    if not host or not port.isdigit():
        print(f"replay: --target must be HOST:PORT, got {args.target!r}", file=sys.stderr)
        return 2
    try:
        conversations = load_conversations(Path(args.recording), need_bodies=True)
    except RecordingError as error:
        print(f"replay: {error}", file=sys.stderr)
        return 2
    options = ReplayOptions(
        host=host.strip("[]"),
        port=int(port),
        speed=args.speed,
        login=args.login,
        passcode=args.passcode,
        vhost=args.vhost,
        wait=args.wait,
        stop_after_refused_logins=max(args.stop_after_refused_logins, 0),
    )
    json_lines = args.json_out == "-"
    output = Output(
        sys.stdout,
        sys.stderr,
        total=0,
        json_lines=json_lines,
        progress=sys.stderr.isatty(),
    )
    replayer = Replayer(conversations, options, on_result=output.result)
    output.total = replayer.total
    try:
        interrupted = asyncio.run(_replay_until_signal(replayer, output))
    except OSError as error:  # the target does not answer: the summary of what was replayed
        output.summary(_summary(replayer, output, None))
        print(f"replay: cannot reach the target {args.target}: {error}", file=sys.stderr)
        return 2
    output.summary(_summary(replayer, output, interrupted))
    if args.json_out and not json_lines:
        results = sorted(replayer.results, key=lambda r: replayer.order.get(r.conn, replayer.total))
        Path(args.json_out).write_text(json.dumps([r.as_json() for r in results], indent=1) + "\n")
    if interrupted:
        return 128 + interrupted
    if replayer.stopped:
        return 2
    return 1 if replayer.differing else 0


def _summary(replayer: Replayer, output: Output, interrupted: int | None) -> Summary:
    from .progress import Summary

    return Summary(
        replayed=len(replayer.results),
        differing=replayer.differing,
        total=replayer.total,
        cut_short=replayer.cut_short,
        seconds=time.monotonic() - output.started,
        interrupted=signal.Signals(interrupted).name if interrupted else None,
        stopped=replayer.stopped,
    )


async def _replay_until_signal(replayer: Replayer, output: Output) -> int | None:
    """Run the replay until it ends or SIGINT/SIGTERM arrives (then it is cancelled: its open
    connections are closed); the signal's number, or None.  A terminal gets the progress line
    refreshed twice a second."""
    loop = asyncio.get_running_loop()
    replaying = asyncio.create_task(replayer.run())
    received: list[int] = []

    def interrupt(signum: int) -> None:
        received.append(signum)
        replaying.cancel()

    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, interrupt, signum)
            handled.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
            pass

    async def refresh() -> None:
        while True:
            output.show_progress()
            await asyncio.sleep(0.5)

    refreshing = asyncio.create_task(refresh()) if output.progress else None
    try:
        await replaying
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        if refreshing is not None:
            refreshing.cancel()
    return received[0] if received else None
