"""The migration report as one self-contained HTML page.

Owns the page: what to change before cutting over (per application: the idioms the profile does
not support or supports differently, with the workaround, and the frames it would refuse), the
message rates per destination as inline SVG charts, the applications, and the RabbitMQ topology
the profile will create.  No script, no external file, no font or style from the network: the
page opens as it is from a mail attachment or a ticket.  Input: the ``report.json`` document of
adapter/migrate/report.py.  Pure (standard library only).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any, Final

__all__ = ["render"]

_SUPPORT_LABEL: Final = {"same": "same", "differs": "differs", "unsupported": "not supported"}
_KIND_ORDER: Final = ("queue", "topic", "temp-queue", "temp-topic", "composite", "exchange", "amq-queue")

_STYLE: Final = """
:root { --ink:#1d2330; --muted:#5d6678; --line:#dde2ea; --bg:#f5f7fa; --card:#fff;
        --red:#c0392b; --red-bg:#fdecea; --amber:#a15c00; --amber-bg:#fff4e0; --green:#1e7b45;
        --green-bg:#e6f5ec; --blue:#2463c7; --teal:#12927f; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
       color:var(--ink); background:var(--bg); }
main { max-width:1180px; margin:0 auto; padding:28px 32px 48px; }
h1 { font-size:26px; margin:0 0 4px; letter-spacing:-0.01em; }
h2 { font-size:19px; margin:36px 0 6px; padding-top:4px; }
h3 { font-size:15px; margin:0 0 8px; }
p.lead, p.sub { color:var(--muted); margin:0 0 14px; }
.totals { display:grid; grid-template-columns:repeat(6,1fr); gap:10px; margin:18px 0 4px; }
.total { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 12px; }
.total b { display:block; font-size:20px; font-variant-numeric:tabular-nums; }
.total span { color:var(--muted); font-size:12px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:14px 16px;
        margin:10px 0; }
.card.ok { border-left:4px solid var(--green); }
.card.warn { border-left:4px solid var(--amber); }
.card.bad { border-left:4px solid var(--red); }
.app-meta { color:var(--muted); font-size:12.5px; margin:-4px 0 10px; }
ul.todo { list-style:none; margin:0; padding:0; }
ul.todo li { display:grid; grid-template-columns:112px 1fr; gap:10px; padding:7px 0;
             border-top:1px solid var(--line); }
ul.todo li:first-child { border-top:0; }
.what { font-weight:600; }
.count { color:var(--muted); font-size:12px; font-weight:normal; }
.badge { display:inline-block; font-size:11.5px; font-weight:600; padding:1px 8px; border-radius:10px;
         white-space:nowrap; text-align:center; align-self:start; }
.badge.unsupported, .badge.refused { color:var(--red); background:var(--red-bg); }
.badge.differs { color:var(--amber); background:var(--amber-bg); }
.badge.same { color:var(--green); background:var(--green-bg); }
table { width:100%; border-collapse:collapse; background:var(--card); border:1px solid var(--line);
        border-radius:8px; overflow:hidden; font-size:13px; }
th, td { text-align:left; padding:6px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:#eef1f6; font-weight:600; font-size:12px; color:#39414f; }
tr:last-child td { border-bottom:0; }
td.n, th.n { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
code { font:12.5px/1.3 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; background:#f0f2f6;
       padding:1px 4px; border-radius:4px; word-break:break-all; }
.charts { display:grid; grid-template-columns:repeat(3,1fr); gap:10px; }
.chart { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 12px 6px; }
.chart h3 { font-size:13px; margin:0 0 2px; overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
.chart .sub { color:var(--muted); font-size:11.5px; }
.legend { color:var(--muted); font-size:12px; margin:0 0 8px; }
.legend i { display:inline-block; width:18px; height:3px; vertical-align:middle; margin:0 4px 0 10px; }
.muted { color:var(--muted); }
.chip { display:inline-block; background:var(--green-bg); color:#17603a; border-radius:12px; padding:2px 10px;
        margin:3px 6px 3px 0; font-size:12.5px; font-weight:600; }
footer { color:var(--muted); font-size:12px; margin-top:36px; }
"""


def _fmt(number: float | int) -> str:
    if isinstance(number, float) and not number.is_integer():
        return f"{number:,.1f}"
    return f"{int(number):,}"


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    return ""  # pragma: no cover


def _time(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _count(number: int, word: str) -> str:
    return f"{_fmt(number)} {word}" if number == 1 else f"{_fmt(number)} {word}s"


def _badge(support: str) -> str:
    return f'<span class="badge {support}">{escape(_SUPPORT_LABEL.get(support, support))}</span>'


def _chart(sent: Sequence[int], delivered: Sequence[int], width_s: int) -> str:
    """An SVG line chart of messages per second, sent (blue) and delivered (teal)."""
    w, h, left, bottom, top = 340, 120, 46, 18, 8
    n = max(len(sent), 1)
    peak = max([*sent, *delivered, 1]) / width_s
    scale = _nice_ceiling(peak)
    plot_w, plot_h = w - left - 6, h - bottom - top

    def points(series: Sequence[int]) -> str:
        step = plot_w / max(n - 1, 1)
        return " ".join(
            f"{left + i * step:.1f},{top + plot_h - (count / width_s) / scale * plot_h:.1f}"
            for i, count in enumerate(series)
        )

    grid = "".join(
        f'<line x1="{left}" x2="{w - 6}" y1="{top + plot_h * (1 - f):.1f}" y2="{top + plot_h * (1 - f):.1f}" '
        f'stroke="#e6e9ef"/><text x="{left - 5}" y="{top + plot_h * (1 - f) + 4:.1f}" text-anchor="end">'
        f"{escape(_axis(scale * f))}</text>"
        for f in (0, 0.5, 1)
    )
    lines = ""
    base = f"{left + plot_w:.1f},{top + plot_h:.1f} {left:.1f},{top + plot_h:.1f}"
    if any(sent):  # an area, so that the delivered line drawn over it never hides it
        lines += (
            f'<polygon fill="#2463c7" fill-opacity="0.14" points="{points(sent)} {base}"/>'
            f'<polyline fill="none" stroke="#2463c7" stroke-width="1.6" stroke-linejoin="round" '
            f'points="{points(sent)}"/>'
        )
    if any(delivered):
        lines += (
            '<polyline fill="none" stroke="#12927f" stroke-width="1.6" stroke-dasharray="4 2" '
            f'stroke-linejoin="round" points="{points(delivered)}"/>'
        )
    span = _duration(n * width_s)
    return (
        f'<svg viewBox="0 0 {w} {h}" width="100%" role="img" font-size="10" fill="#5d6678" '
        f'font-family="system-ui,sans-serif">{grid}{lines}'
        f'<text x="{left}" y="{h - 4}">0</text>'
        f'<text x="{w - 6}" y="{h - 4}" text-anchor="end">{escape(span)}</text>'
        "</svg>"
    )


def _nice_ceiling(value: float) -> float:
    magnitude = 10.0 ** _floor_log10(value)
    for base in (1.0, 2.0, 5.0):
        if value <= base * magnitude:
            return base * magnitude
    return 10.0 * magnitude


def _floor_log10(value: float) -> int:
    exponent = 0
    if value <= 0:
        return 0
    while value >= 10:
        value /= 10
        exponent += 1
    while value < 1:
        value *= 10
        exponent -= 1
    return exponent


def _axis(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k/s"
    return f"{value:g}/s"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = ()) -> str:
    right = set(numeric)
    head = "".join(
        f'<th class="n">{escape(h)}</th>' if i in right else f"<th>{escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{c}</td>' if i in right else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _to_change(document: Mapping[str, Any]) -> str:
    refused_by_app: dict[str, list[Mapping[str, Any]]] = {}
    for refusal in document["refused"]:
        refused_by_app.setdefault(refusal["application"], []).append(refusal)
    cards = []
    quiet = []
    order = {"unsupported": 0, "differs": 1}
    for app in document["applications"]:
        items = sorted(
            (i for i in app["idioms"] if i["support"] != "same"),
            key=lambda i: (order[i["support"]], i["name"]),
        )
        refused = refused_by_app.get(app["name"], [])
        vhosts = [v for v in app["vhosts"] if v not in ("/", "")]
        if not items and not refused and not vhosts:
            quiet.append(app["name"])
            continue
        rows = []
        for refusal in refused:
            rows.append(
                '<li><span class="badge refused">refused</span><div>'
                f'<span class="what">{escape(refusal["command"])} '
                f"<code>{escape(refusal['destination'])}</code>: "
                f"ERROR {escape(refusal['message'])}</span><br>"
                f'<span class="muted">{escape(refusal["detail"])}</span></div></li>'
            )
        for item in items:
            rows.append(
                f'<li>{_badge(item["support"])}<div><span class="what">{escape(item["name"])}</span> '
                f'<span class="count">{_count(item["connections"], "connection")}, '
                f"{_count(item['frames'], 'frame')}</span>"
                f"<br>{escape(item['note'])}</div></li>"
            )
        if vhosts:
            rows.append(
                '<li><span class="badge differs">vhost</span><div>'
                '<span class="what">CONNECT host header</span> '
                f"<code>{escape(', '.join(vhosts))}</code><br>RabbitMQ reads <code>host</code> as the "
                "virtual host: create it (with the users' permissions) or drop the header from the "
                "client's settings.</div></li>"
            )
        level = "bad" if refused or any(i["support"] == "unsupported" for i in items) else "warn"
        cards.append(
            f'<div class="card {level}"><h3>{escape(app["name"])}</h3>'
            f'<div class="app-meta">{_count(app["connections"], "connection")} · STOMP '
            f"{escape(', '.join(app['stomp_versions']) or '?')}</div>"
            f'<ul class="todo">{"".join(rows)}</ul></div>'
        )
    if quiet:
        cards.append(
            '<div class="card ok"><h3>Nothing to change</h3>'
            '<div class="app-meta">Every idiom these applications use is served the same by the '
            "profile.</div>"
            + "".join(f'<span class="chip">{escape(name)}</span>' for name in quiet)
            + "</div>"
        )
    return "".join(cards) or '<div class="card ok">No application in the recording.</div>'


def _idioms(document: Mapping[str, Any]) -> str:
    rows = [
        (
            f"<code>{escape(i['name'])}</code>",
            escape(i["title"]),
            _badge(i["support"]),
            _fmt(i["applications"]),
            _fmt(i["connections"]),
            _fmt(i["frames"]),
        )
        for i in document["idioms"]
    ]
    return _table(
        ("Idiom", "What", "Profile", "Applications", "Connections", "Frames"), rows, numeric=(3, 4, 5)
    )


def _rates(document: Mapping[str, Any]) -> str:
    width = document["totals"]["bucket_seconds"]
    charts = []
    for dest in document["destinations"]:
        rate = dest.get("rate")
        if rate is None:
            continue
        charts.append(
            f'<div class="chart"><h3 title="{escape(dest["destination"])}">{escape(dest["destination"])}</h3>'
            f'<div class="sub">{_fmt(dest["sent"])} sent · {_fmt(dest["delivered"])} delivered · avg '
            f"{_size(dest['avg_size'])}</div>{_chart(rate['sent'], rate['delivered'], width)}</div>"
        )
    if not charts:
        return '<p class="muted">No messages in the recording.</p>'
    legend = (
        '<p class="legend">Messages per second, averaged over '
        f'{escape(_duration(width))} buckets:<i style="background:#2463c7"></i>sent'
        '<i style="background:repeating-linear-gradient(90deg,#12927f 0 4px,transparent 4px 6px)"></i>'
        "delivered</p>"
    )
    return legend + f'<div class="charts">{"".join(charts)}</div>'


def _applications(document: Mapping[str, Any]) -> str:
    rows = []
    for app in document["applications"]:
        kinds = []
        for kind in sorted(
            app["destinations"], key=lambda k: (_KIND_ORDER.index(k) if k in _KIND_ORDER else 99, k)
        ):
            entries = app["destinations"][kind]
            sent = sum(e["sent"] for e in entries)
            delivered = sum(e["delivered"] for e in entries)
            kinds.append(f"{escape(kind)} ×{len(entries)} ({_fmt(sent)} sent, {_fmt(delivered)} delivered)")
        size = max((e["max_size"] for entries in app["destinations"].values() for e in entries), default=0)
        rows.append(
            (
                f"<b>{escape(app['name'])}</b>",
                escape(", ".join(app["stomp_versions"]) or "?"),
                _fmt(app["connections"]),
                _fmt(app["frames"]),
                "<br>".join(kinds) or '<span class="muted">none</span>',
                _size(size),
            )
        )
    return _table(
        (
            "Application (user@host, client-id)",
            "STOMP",
            "Connections",
            "Frames",
            "Destinations",
            "Largest body",
        ),
        rows,
        numeric=(2, 3, 5),
    )


def _flags(queue: Mapping[str, Any]) -> str:
    if queue["durable"] is None:
        return '<span class="muted">(exists)</span>'
    flags = ["durable" if queue["durable"] else "transient"]
    if queue["auto_delete"]:
        flags.append("auto-delete")
    if queue["exclusive"]:
        flags.append("exclusive")
    return escape(", ".join(flags))


def _topology(document: Mapping[str, Any]) -> str:
    topology = document["topology"]
    queues = [
        (
            f"<code>{escape(q['name'])}</code>"
            + (f'<br><span class="muted">{escape(q["note"])}</span>' if q["note"] else ""),
            _flags(q),
            "<br>".join(f"<code>{escape(k)}={escape(str(v))}</code>" for k, v in q["arguments"].items())
            or '<span class="muted">none</span>',
            escape(", ".join(q["declared_by"])),
            escape(", ".join(q["applications"])),
        )
        for q in topology["queues"]
    ]
    bindings = [
        (
            f"<code>{escape(b['exchange'])}</code>",
            f"<code>{escape(b['routing_key'])}</code>",
            f"<code>{escape(b['queue'])}</code>"
            + (f'<br><b class="badge unsupported">{escape(b["note"])}</b>' if b["note"] else ""),
            escape(", ".join(b["applications"])),
        )
        for b in topology["bindings"]
    ]
    exchanges = ", ".join(
        f'<code>{escape(e["name"])}</code> <span class="muted">({escape(e["note"])})</span>'
        for e in topology["exchanges"]
    )
    return (
        f"<h3>Queues ({len(queues)})</h3>"
        + _table(("Queue", "Flags", "Arguments", "Declared by", "Applications"), queues)
        + f'<h3 style="margin-top:16px">Bindings ({len(bindings)})</h3>'
        + (
            _table(("Exchange", "Routing key", "Queue", "Applications"), bindings)
            if bindings
            else "<p>None.</p>"
        )
        + f'<p style="margin-top:12px"><b>Exchanges:</b> {exchanges or "none"}.</p>'
    )


def render(document: Mapping[str, Any]) -> str:
    """The report page of a ``report.json`` document."""
    totals = document["totals"]
    cards = [
        (_fmt(totals["applications"]), "applications"),
        (_fmt(totals["connections"]), "connections"),
        (_fmt(totals["frames"]), "frames"),
        (_fmt(totals["messages_sent"]), "messages sent"),
        (_fmt(totals["messages_delivered"]), "messages delivered"),
        (_duration(max((totals["end"] or 0) - (totals["start"] or 0), 0)), "recorded"),
    ]
    counts = {"unsupported": 0, "differs": 0}
    for item in document["idioms"]:
        if item["support"] in counts:
            counts[item["support"]] += 1
    summary = (
        f"{len(document['idioms'])} ActiveMQ idioms in use: {counts['unsupported']} not supported by the "
        f"<code>activemq</code> profile, {counts['differs']} served differently, "
        f"{len(document['refused'])} distinct {'frame' if len(document['refused']) == 1 else 'frames'} "
        "it would refuse."
    )
    warnings = []
    if totals["dropped_records"]:
        warnings.append(
            f"The tap dropped {_fmt(totals['dropped_records'])} records: the figures are lower bounds."
        )
    if totals["unparsable_frames"]:
        warnings.append(f"{_fmt(totals['unparsable_frames'])} frames could not be parsed.")
    boxes = "".join(f'<div class="total"><b>{v}</b><span>{escape(label)}</span></div>' for v, label in cards)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Migration report: ActiveMQ STOMP to RabbitMQ</title>
<style>{_STYLE}</style></head>
<body><main>
<h1>Moving to RabbitMQ: migration report</h1>
<p class="lead">Recorded STOMP traffic from {escape(_time(totals["start"]))}
to {escape(_time(totals["end"]))},
analysed for the adapter's <code>activemq</code> profile. {summary}</p>
{"".join(f'<p class="card warn">{escape(w)}</p>' for w in warnings)}
<div class="totals">{boxes}</div>

<h2>1. What to change before cutting over</h2>
<p class="sub">Per application: what the profile refuses, does not support or does differently,
and what to do.</p>
{_to_change(document)}

<h2>2. Message rates per destination</h2>
<p class="sub">The {sum(1 for d in document["destinations"] if "rate" in d)} busiest destinations of
{len(document["destinations"])}.</p>
{_rates(document)}

<h2>3. The RabbitMQ topology the <code>activemq</code> profile will create</h2>
<p class="sub">From the profile's own rules (<code>adapter/mapping/profile.py</code>) applied to every
distinct SEND and SUBSCRIBE recorded: pre-declare these, or size the broker for them.</p>
{_topology(document)}

<h2>4. Idioms in use</h2>
{_idioms(document)}

<h2>5. Applications</h2>
{_applications(document)}

<footer>stomp-amqp-adapter · <code>python -m adapter.migrate report</code> ·
recording <code>{escape(str(document["recording"]))}</code> · {_fmt(totals["records"])} records</footer>
</main></body></html>
"""
