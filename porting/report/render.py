"""The report as HTML (table + inline SVG), Markdown and terminal text. Every text that comes from
the run directory is escaped: HTML with ``html.escape``, Markdown the same (a Markdown viewer passes
raw HTML such as ``<script>`` through) plus ``|`` and line breaks, which would break the table."""

from __future__ import annotations

import html
from pathlib import Path

from porting.report.rows import FAIL, INFO, MISSING, PASS, STATUSES, WARN, Row

STATUS_COLORS = {PASS: "#d4f4d4", FAIL: "#f8d0d0", WARN: "#fbeec0", INFO: "#e4ecf8", MISSING: "#eeeeee"}
PLOT_FILES = ("loss.svg", "step_time.svg", "memory.svg")


def render_html(name: str, rows: list[Row], svgs: dict[str, str], notes: list[str], steps: int) -> str:
    title = f"port report: {name}"
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    trs = "".join(
        f'<tr class="row {r.status}" data-area="{html.escape(r.area)}"><td>{html.escape(r.area)}</td>'
        f'<td>{html.escape(r.item)}</td><td class="status" style="background:{STATUS_COLORS[r.status]}">'
        f'{r.status}</td><td>{html.escape(r.value)}</td><td><code>{html.escape(r.evidence)}</code></td></tr>'
        for r in rows)
    items = "".join(f"<li>{html.escape(p)}</li>" for p in notes)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;width:100%}"
            "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;vertical-align:top}th{background:#f4f4f4}"
            ".plots{display:flex;flex-wrap:wrap;gap:12px;margin-top:16px}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p id=\"summary\">"
            + ", ".join(f"{v} {k}" for k, v in counts.items()) + f" &mdash; {steps} step(s)</p>"
            "<table id=\"acceptance\"><thead><tr><th>area</th><th>item</th><th>status</th><th>value</th>"
            f"<th>evidence</th></tr></thead><tbody>{trs}</tbody></table>"
            f"<div class=\"plots\">{''.join(svgs.values())}</div>"
            + (f"<h2>Notes</h2><ul id=\"notes\">{items}</ul>" if items else "") + "</body></html>")


# CommonMark: "any ASCII punctuation character may be backslash-escaped" and is then literal (spec 2.4).
# These are the ones that open or close an inline construct (emphasis, code, a link or image's text,
# strike-through, a table cell) or a heading; a link's target needs the text's brackets, so parentheses stay.
# The three HTML ones are written as entities instead, as for HTML.
MD_SPECIAL = frozenset("\\`*_[]#!|~")


def md_text(s: str) -> str:
    """Text safe in Markdown, as ``html.escape`` makes it safe in HTML: every Markdown character literal
    (a run file's ``![x](https://host/p.png)`` is shown, never an image a viewer fetches; ``**``, ``#``,
    ``[`` and ``|`` never format or break the table), HTML escaped, one line."""
    out = "".join("\\" + c if c in MD_SPECIAL else c if c.isprintable() else " " for c in s)
    return html.escape(out, quote=False)


def md_code(s: str) -> str:
    """A code span: its content is literal in Markdown (no HTML), so only backticks (which would end
    the span) and pipes / line breaks (which would end the cell) are replaced."""
    return "`" + s.replace("`", "'").replace("|", "\\|").replace("\r", " ").replace("\n", " ") + "`"


def render_md(name: str, rows: list[Row], notes: list[str]) -> str:
    lines = [f"# port report: {md_text(name)}", "", "| area | item | status | value | evidence |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {md_text(r.area)} | {md_text(r.item)} | **{r.status}** | {md_text(r.value)} | "
                     f"{md_code(r.evidence)} |")
    lines += ["", " ".join(f"![{f[:-4].replace('_', ' ')}]({f})" for f in PLOT_FILES)]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {md_text(p)}" for p in notes]
    return "\n".join(lines) + "\n"


def render_text(out: Path, rows: list[Row], notes: list[str]) -> str:
    lines = [f"{'area':<14} {'item':<38} {'status':<8} value"]
    for r in rows:
        lines.append(f"{r.area:<14} {r.item:<38} {r.status:<8} {r.value[:110]}")
    lines.append("")
    lines.append(f"wrote {out}/report.html, report.md, report.json, {', '.join(PLOT_FILES)}")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)
