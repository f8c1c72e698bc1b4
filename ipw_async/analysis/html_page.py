"""The frame every ``report.html`` shares: its style sheet, escaping, tables, inline figures,
banners and the page around the sections."""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from matplotlib.figure import Figure

from .._version import __version__
from ..report import DASH
from ..rundir import files
from .html_figures import svg
from .plotting import SkipPlot

REPORT = files.REPORT  # in a run directory, or a sweep's sweep/ folder

STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;background:#fff;
max-width:1100px;margin:2rem auto;padding:0 1rem}
h1{font-size:1.45rem;margin-bottom:.2rem}
h2{font-size:1.15rem;border-bottom:1px solid #d1d9e0;padding-bottom:.2rem;margin-top:2.2rem}
h3{font-size:1rem;margin:1.4rem 0 .3rem}
nav a{margin-right:1rem}
table{border-collapse:collapse;font:13px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;margin:.4rem 0 1rem}
caption{text-align:left;font-weight:600;padding:.2rem 0}
th,td{border:1px solid #d1d9e0;padding:.2rem .6rem;vertical-align:top;text-align:left}
th{background:#f6f8fa}
td.r{text-align:right;white-space:nowrap}
#headline-table td:first-child{white-space:nowrap}
.banner{padding:.6rem 1rem;border:1px solid;border-radius:6px;margin:.6rem 0}
.banner.sim{background:#ddf4ff;border-color:#54aeff}
.banner.partial{background:#fff8c5;border-color:#d4a72c}
.meta,.why,figcaption,footer{color:#59636e}
figure{margin:1.2rem 0}
figure svg{max-width:100%;height:auto}
figure p.missing{border:1px dashed #d1d9e0;padding:1rem;margin:0}
pre{background:#f6f8fa;padding:.8rem;overflow-x:auto;font-size:12px}
"""


def esc(value: object) -> str:
    return html.escape(str(value))


def cell(value: float | None, spec: str = ",.4g", unit: str = "") -> str:
    """A figure as page text; a dash when it was not measured (never 0)."""
    return DASH if value is None else esc(f"{value:{spec}}{unit}")


def missing_text(reason: str | None) -> str:
    return DASH + (f' <span class="why">({esc(reason)})</span>' if reason else "")


def html_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], table_id: str, caption: str = "", align: str = ""
) -> str:
    """A table of cells that are already HTML (what came from the run escaped before).

    ``align`` has an ``r`` for each column of figures (right-aligned, not wrapped).
    """
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="r">{c}</td>' if align[i : i + 1] == "r" else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    title = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<table id="{table_id}">{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def svg_figure(fig_id: str, caption: str, draw: Callable[[], Figure]) -> str:
    """A figure as inline SVG, or a dash with the reason its data is missing."""
    try:
        body = svg(draw())
    except SkipPlot as exc:
        body = f'<p class="missing">{missing_text(str(exc))}</p>'
    return f'<figure id="{fig_id}">{body}<figcaption>{esc(caption)}</figcaption></figure>'


def banner(kind: str, head: str, text: str) -> str:
    return f'<div class="banner {kind}" id="banner-{kind}"><strong>{esc(head)}</strong> {text}</div>'


def whole_page(title: str, header: str, sections: list[tuple[str, str, str]], details: dict[str, Any]) -> str:
    """The whole page: ``sections`` are (id, heading, body); empty bodies are left out."""
    shown = [(sid, heading, body) for sid, heading, body in sections if body]
    nav = "".join(f'<a href="#{sid}">{esc(heading)}</a>' for sid, heading, _ in shown)
    parts = "".join(
        f'<section id="{sid}"><h2>{esc(heading)}</h2>{body}</section>' for sid, heading, body in shown
    )
    settings = esc(json.dumps(details, indent=2, default=str))
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<header>{header}</header><nav>{nav}</nav>{parts}"
        f'<section id="settings"><h2>Settings</h2><details><summary>configuration, versions and host'
        f"</summary><pre>{settings}</pre></details></section>"
        f"<footer><p>Written by ipw-async {esc(__version__)} from the directory's own files; "
        f"nothing on this page is fetched from elsewhere.</p></footer></body></html>"
    )
