"""report.html: one self-contained page (its images embedded), readable offline, headline figures first."""

from __future__ import annotations

import base64
import html
from pathlib import Path

STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,td:last-child,th{text-align:left}.figures td{font-size:18px}img{max-width:100%}"""


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _table(header: list[str], rows: list[list[str]], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><tr>{head}</tr>{body}</table>'


def render(title: str, headline: list[tuple[str, str]], sections: list[tuple[str, str, Path | None]],
           class_table: tuple[list[str], list[list[str]]]) -> str:  # fmt: skip
    """The page: `headline` (name, value) pairs, the per-class table, then each (heading, text, image)."""
    parts = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        _table([name for name, _ in headline], [[value for _, value in headline]], "figures"),
        "<h2>Per class</h2>",
        _table(*class_table),
    ]
    for heading, text, image in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2><p>{html.escape(text)}</p>")
        if image is not None:
            parts.append(_image(image, heading))
    parts.append("</body></html>\n")
    return "\n".join(parts)
