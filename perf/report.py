"""What a scenario hands back, and how it is shown: a short table, a JSON file, optional PNG plots.

A `Report` is plain data: settings, the target's description, rows (one dict per measured point,
each with a `label` that identifies the point across runs, which `compare` matches on), the
columns to print, checks (name -> ok/detail) and plot specs.  Rendering lives here so scenarios
stay small and every output looks the same.  Plots use matplotlib's Agg backend (no display).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from lanner.perf.paths import writable

# Columns most scenarios print: (row key, header, format).
RATE_COLUMNS = [("ops_s", "ops/s", "{:,.0f}"), ("p50_us", "p50 µs", "{:,.0f}"), ("p99_us", "p99 µs", "{:,.0f}"),
                ("p999_us", "p99.9 µs", "{:,.0f}"), ("client_us_op", "client µs/op", "{:.1f}"),
                ("server_us_op", "server µs/op", "{:.1f}"),
                ("server_us_op_by_role", "by role (w/f/a/c/s)", "{:.1f}")]


@dataclass(slots=True)
class Check:
    ok: bool
    detail: str


@dataclass(slots=True)
class Plot:
    """A line plot of row values: x column against one or more y columns."""
    file: str
    x: str
    ys: list[str]
    xlabel: str
    ylabel: str
    title: str
    logx: bool = False
    logy: bool = False
    rows: str = ""          # only rows whose `phase` equals this (empty: all rows)
    kind: str = "line"      # line | bar (bar: one group per row, bars are the ys)
    labels: dict = field(default_factory=dict)   # legend name per y column (default: the column)


@dataclass(slots=True)
class Report:
    scenario: str
    settings: dict
    target: dict
    rows: list[dict] = field(default_factory=list)
    columns: list[tuple] = field(default_factory=list)
    checks: dict[str, Check] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks.values())

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks[name] = Check(bool(ok), detail)

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "ok": self.ok, "settings": self.settings, "target": self.target,
                "rows": self.rows, "checks": {k: asdict(v) for k, v in self.checks.items()},
                "notes": self.notes, "machine": machine(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def machine() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "memory_mb": psutil.virtual_memory().total // 2**20}


def format_table(columns: list[tuple], rows: list[dict]) -> str:
    cols = [("label", "", "{}")] + list(columns)
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        cells.append([_fmt(fmt, r.get(key)) for key, _, fmt in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = []
    for n, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(fmt: str, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):      # per role: "w 12.3 f 8.1" (first letter of the role)
        return " ".join(f"{k[0]} {fmt.format(v)}" for k, v in value.items())
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def render(report: Report) -> str:
    out = [f"== {report.scenario} against {report.target.get('name')} ({report.target.get('kind')})"]
    out.append(format_table(report.columns, report.rows))
    for name, c in report.checks.items():
        out.append(f"check {name}: {'ok' if c.ok else 'FAILED'} - {c.detail}")
    out += [f"note: {n}" for n in report.notes]
    return "\n".join(out)


def out_dir(base: str | None, scenario: str) -> Path:
    root = Path(base) if base else default_out_root()
    path = root / f"{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{scenario}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    path.mkdir(parents=True)
    return path


def default_out_root() -> Path:
    here = Path(__file__).resolve().parent / "out"
    if writable(here):
        return here
    return Path.cwd() / "lanner-perf-out"


def write_json(report: Report, directory: Path) -> Path:
    path = directory / "result.json"
    path.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    return path


def write_plots(report: Report, directory: Path) -> list[Path]:
    if not report.plots:
        return []
    # lazy: plotting and progress bars are optional extras of a perf run
    import matplotlib
    matplotlib.use("Agg")
    # lazy: plotting and progress bars are optional extras of a perf run
    import matplotlib.pyplot as plt

    paths = []
    for spec in report.plots:
        rows = [r for r in report.rows if not spec.rows or r.get("phase") == spec.rows]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
        if spec.kind == "bar":
            width = 0.8 / max(1, len(spec.ys))
            for i, y in enumerate(spec.ys):
                ax.bar([j + i * width for j in range(len(rows))], [r.get(y) or 0 for r in rows], width,
                       label=spec.labels.get(y, y))
            ax.set_xticks([j + width * (len(spec.ys) - 1) / 2 for j in range(len(rows))])
            ax.set_xticklabels([str(r.get(spec.x)) for r in rows])
        else:
            for y in spec.ys:
                ax.plot([r.get(spec.x) for r in rows], [r.get(y) for r in rows], marker="o",
                        label=spec.labels.get(y, y))
        if spec.logx:
            xs = [r.get(spec.x) for r in rows if isinstance(r.get(spec.x), (int, float))]
            if xs and min(xs) <= 0:
                ax.set_xscale("symlog", linthresh=max(1, min((x for x in xs if x > 0), default=1)))
            else:
                ax.set_xscale("log")
        if spec.logy:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel(spec.xlabel)
        ax.set_ylabel(spec.ylabel)
        ax.set_title(spec.title, fontsize=10)
        ax.grid(True, alpha=0.3)
        if len(spec.ys) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / spec.file
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


class _NoBar:
    """Stands in for tqdm when stderr is not a terminal."""
    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


def progress_bar(total: float | None, desc: str, enabled: bool = True, unit: str = "it"):
    """A tqdm bar on a terminal, nothing otherwise (CI logs stay clean)."""
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    # lazy: plotting and progress bars are optional extras of a perf run
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True)
