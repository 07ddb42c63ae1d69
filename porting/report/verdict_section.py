"""The report's first screen: the verdict a team signs, before the acceptance table.

From the comparison `port compare` wrote beside the run (``RUNDIR/compare.json`` or ``--compare FILE``, read by
:mod:`porting.report.compare_section`): the field's gates (loss mean relative error, loss-weighted per-step relative
error, evaluation loss, throughput per device-equivalent; porting/baseline/gates.py), each PASS, FAIL or N/A with its
figures and the source of its bound, then the settings that differ between the two sides with their expected effect
on the curve (porting/baseline/effective.py). Without a comparison the screen says so and names the command. Every
string from a file is escaped by the renderer that prints it (porting/report/render.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from porting.baseline.comparison import AnyComparison, GateRow, SettingRow

FIX = "port compare BASELINE RUNDIR --out RUNDIR/compare.json (then port report RUNDIR)"


@dataclass(frozen=True)
class Verdict:
    """What the first screen shows: the verdict in one word, its gates, the differing settings, where it came from."""

    status: str                       # PASS, FAIL or MISSING
    gates: tuple[GateRow, ...]
    differing: tuple[SettingRow, ...]
    unknown: tuple[str, ...]          # settings one side's files cannot tell
    source: str                       # the comparison file, or the command that makes one

    def to_dict(self) -> dict:
        from model_zoo import typed

        return {"status": self.status, "gates": [typed.write(g) for g in self.gates],
                "differing_settings": [typed.write(r) for r in self.differing], "unknown_settings": list(self.unknown),
                "source": self.source}


def verdict(cmp: AnyComparison | None, path: str | None) -> Verdict:
    """The first screen of a comparison (None: missing, with the command that makes one)."""
    if cmp is None or cmp.field is None:
        why = "no comparison beside the run" if cmp is None else "a comparison written before the field's gates"
        return Verdict("MISSING", (), (), (), f"{why}: {FIX}")
    rows = cmp.settings_table
    return Verdict("PASS" if cmp.ok and cmp.field.ok else "FAIL", cmp.field.rows,
                   tuple(r for r in rows if r.equal is False), tuple(r.setting for r in rows if r.equal is None),
                   str(path))


def _value(g: GateRow) -> str:
    if g.value is None:
        return "-"
    return f"{g.value:.3f}x" if g.bound == ">=" else f"{g.value:.3%}"


def _bound(g: GateRow) -> str:
    return f"{g.bound} {g.threshold:g}x" if g.bound == ">=" else f"{g.bound} {g.threshold:.0%}"


def text_lines(v: Verdict) -> list[str]:
    """The verdict as terminal lines (first, before the acceptance rows)."""
    lines = [f"VERDICT: {v.status}  ({v.source})"]
    for g in v.gates:
        lines.append(f"  {g.status:<4} {g.name:<40} {_value(g):>9} {_bound(g):<8} {g.figures[:120]}")
    if v.differing:
        lines.append(f"  settings that differ ({len(v.differing)}):")
        lines += [f"    {r.setting}: CUDA {r.cuda[:50]} | port {r.port[:50]} -> {r.effect[:90]}" for r in v.differing]
    if v.unknown:
        lines.append(f"  not knowable from one side's files: {', '.join(v.unknown)}")
    return lines + [""]


def gate_cells(g: GateRow) -> tuple[str, str, str, str, str, str]:
    """(status, gate, value, bound, figures, source) of one gate, for the HTML and Markdown tables."""
    return g.status, g.name, _value(g), _bound(g), g.figures, g.source


def setting_cells(r: SettingRow) -> tuple[str, str, str, str]:
    """(setting, CUDA side, port side, expected effect) of a differing setting."""
    return r.setting, f"{r.cuda} ({r.cuda_source})", f"{r.port} ({r.port_source})", r.effect
