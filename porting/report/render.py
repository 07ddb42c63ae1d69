"""The report as HTML (table + inline SVG), Markdown and terminal text. Every text that comes from
the run directory is escaped: HTML with ``html.escape``, Markdown the same (a Markdown viewer passes
raw HTML such as ``<script>`` through) plus ``|`` and line breaks, which would break the table."""

from __future__ import annotations

import html
from pathlib import Path

from porting.report.rows import FAIL, INFO, MISSING, PASS, STATUSES, WARN, Row
from porting.report.verdict_section import Verdict, gate_cells, setting_cells, text_lines

STATUS_COLORS = {PASS: "#d4f4d4", FAIL: "#f8d0d0", WARN: "#fbeec0", INFO: "#e4ecf8", MISSING: "#eeeeee"}
GATE_COLORS = {"PASS": STATUS_COLORS[PASS], "FAIL": STATUS_COLORS[FAIL], "N/A": STATUS_COLORS[MISSING],
               "MISSING": STATUS_COLORS[MISSING]}
PLOT_FILES = ("loss.svg", "step_time.svg", "memory.svg")


def verdict_html(v: Verdict) -> str:
    """The first screen: the verdict, its gates and the settings that differ (every string escaped)."""
    e = html.escape
    gates = "".join(f'<tr class="gate"><td style="background:{GATE_COLORS.get(c[0], "#eee")}">{e(c[0])}</td>'
                    + "".join(f"<td>{e(x)}</td>" for x in c[1:]) + "</tr>" for c in map(gate_cells, v.gates))
    diff = "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in setting_cells(r)) + "</tr>" for r in v.differing)
    return (f'<section id="verdict"><h2 style="background:{GATE_COLORS.get(v.status, "#eee")}">Verdict: {e(v.status)}'
            f'</h2><p><code>{e(v.source)}</code></p>'
            + (f"<table><thead><tr><th>result</th><th>gate</th><th>value</th><th>bound</th><th>figures</th>"
               f"<th>source of the bound</th></tr></thead><tbody>{gates}</tbody></table>" if gates else "")
            + (f"<h3>Settings that differ</h3><table><thead><tr><th>setting</th><th>CUDA side</th><th>port side</th>"
               f"<th>expected effect on the curve</th></tr></thead><tbody>{diff}</tbody></table>" if diff else "")
            + (f"<p>Not knowable from one side's files: {e(', '.join(v.unknown))}</p>" if v.unknown else "")
            + "</section>")


def render_html(name: str, rows: list[Row], svgs: dict[str, str], notes: list[str], steps: int,
                verdict: Verdict | None = None) -> str:
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
            f"<h1>{html.escape(title)}</h1>" + (verdict_html(verdict) if verdict else "") + "<p id=\"summary\">"
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


def verdict_md(v: Verdict) -> list[str]:
    """The first screen in Markdown: the verdict, its gates, the settings that differ."""
    lines = [f"## Verdict: **{v.status}**", "", md_code(v.source), ""]
    if v.gates:
        lines += ["| result | gate | value | bound | figures | source of the bound |", "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(md_text(x) for x in gate_cells(g)) + " |" for g in v.gates] + [""]
    if v.differing:
        lines += ["### Settings that differ", "", "| setting | CUDA side | port side | expected effect on the curve |",
                  "|---|---|---|---|"]
        lines += ["| " + " | ".join(md_text(x) for x in setting_cells(r)) + " |" for r in v.differing] + [""]
    if v.unknown:
        lines += [f"Not knowable from one side's files: {md_text(', '.join(v.unknown))}", ""]
    return lines


def render_md(name: str, rows: list[Row], notes: list[str], verdict: Verdict | None = None) -> str:
    lines = [f"# port report: {md_text(name)}", "", *(verdict_md(verdict) if verdict else []),
             "| area | item | status | value | evidence |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {md_text(r.area)} | {md_text(r.item)} | **{r.status}** | {md_text(r.value)} | "
                     f"{md_code(r.evidence)} |")
    lines += ["", " ".join(f"![{f[:-4].replace('_', ' ')}]({f})" for f in PLOT_FILES)]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {md_text(p)}" for p in notes]
    return "\n".join(lines) + "\n"


def render_text(out: Path, rows: list[Row], notes: list[str], verdict: Verdict | None = None) -> str:
    lines = (text_lines(verdict) if verdict else []) + [f"{'area':<14} {'item':<38} {'status':<8} value"]
    for r in rows:
        lines.append(f"{r.area:<14} {r.item:<38} {r.status:<8} {r.value[:110]}")
    lines.append("")
    lines.append(f"wrote {out}/report.html, report.md, report.json, {', '.join(PLOT_FILES)}")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)
