"""``report.html`` and ``compare.html`` as a reader opens them: in headless Chromium,
offline, from real run directories.

Two short ramps against the built-in simulator (same stages, different workloads)
make the run directories; ``servemon report`` rewrites one report and ``servemon
compare`` compares both. A two-step capacity search over two SLO tiers, beside them,
makes a third report, whose plots must draw each tier's thresholds and capacity.
Each page is then checked four ways: it references nothing outside itself (and names
no external URL at all), Chromium logs no console message while loading it, the DOM
Chromium rendered holds the summary table and SVG plots with drawn data, and a
screenshot of it is not blank and shows the data colours.

Chromium's console goes to stderr with ``--enable-logging=stderr``: every console
message, whatever its level, is one ``...:CONSOLE:LINE] "text", source: URL`` line.
The pages carry no script, so any console line is a failure; a canary page with a
deliberate ``console.error`` and a broken SVG path proves the check sees them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np  # matplotlib's own dependency
import pytest
from matplotlib.image import imread

CHROMIUM = shutil.which("chromium")

pytestmark = [
    pytest.mark.e2e,
    # The first test also builds the module's pages: two ramps and a capacity
    # search side by side, a report, a comparison and six Chromium runs (about 45 s
    # on a busy 2-CPU machine).
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="needs Debian's chromium on PATH (scripts/system-deps installs it)",
    ),
]

#: Headless and offline: no first-run, sync, update or background fetches.
HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)
WINDOW = (1200, 3000)
CONSOLE_LINE = re.compile(r":CONSOLE(?::\d+)?\]\s*(.*)")
#: The two runs: same stages (so they share load levels), different workloads.
STAGES = "4:1.5,8:1.5"
WORKLOADS = {"a": "random:prompt=16,output=8", "b": "random:prompt=64,output=24"}
LEVELS = ["4 rps", "8 rps"]
#: The capacity search: 4 then 8 req/s (--rps-max), two tiers loose enough that both
#: steps meet both on a busy machine, so each tier's capacity is 8 req/s.
CAPACITY = (
    *("capacity", "--rps-min", "4", "--rps-max", "8"),
    *("--step-seconds", "1.5", "--settle", "0.5"),
    *("--slo", "interactive=ttft_p95<=2,itl_p95<=1", "--slo", "batch=e2e_p95<=10"),
)
#: The SVG ids (matplotlib gids, loadgen/reports/marks.py) of the decision's marks.
CAPACITY_MARKS = {
    "slo-interactive-ttft_p95",
    "slo-interactive-itl_p95",
    "slo-batch-e2e_p95",
    "capacity-interactive",
    "capacity-batch",
    "timeline-slo-interactive-ttft_p95",
    "timeline-capacity-interactive",
    "timeline-capacity-batch",
}
#: matplotlib's default colour cycle: the colours data series are drawn in.
TAB10 = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)
#: Attributes that make a browser fetch or follow something.
URL_ATTRIBUTES = {
    "src", "href", "xlink:href", "srcset", "data", "action", "formaction",
    "poster", "background", "cite", "longdesc", "manifest", "ping",
}  # fmt: skip
NAMESPACE_DECLARATION = re.compile(r"""xmlns(?::[\w.-]+)?\s*=\s*["']([^"']*)["']""")
EXTERNAL_URL = re.compile(r"""(?:https?|ftp)://[^\s"'<>)]+""")


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """Kill a process started in its own session, and its group (still unreaped)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _start(args: Sequence[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        list(args),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(
    proc: subprocess.Popen[str], timeout: float, what: str
) -> subprocess.CompletedProcess[str]:
    """Wait for ``proc``; on timeout kill its whole group and fail the test."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"{what}: still running after {timeout} s\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _servemon(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return _start([sys.executable, "-m", "servemon", *args], cwd)


def _ok(result: subprocess.CompletedProcess[str], what: str) -> str:
    assert result.returncode == 0, f"{what}: exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


_profiles = count()


@dataclass(frozen=True, slots=True)
class Opened:
    """What headless Chromium made of one page."""

    stdout: str
    console: list[str]


def _chromium(page: Path, workdir: Path, *args: str) -> Opened:
    """Open ``page`` in a fresh headless Chromium with ``args``."""
    assert CHROMIUM is not None
    profile = workdir / f"chromium-profile-{next(_profiles)}"
    proc = _start(
        [CHROMIUM, *HEADLESS, f"--user-data-dir={profile}", *args, page.as_uri()],
        workdir,
    )
    try:
        result = _finish(proc, 60, f"chromium {' '.join(args)} {page.name}")
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    console = [m.group(1) for m in CONSOLE_LINE.finditer(result.stderr)]
    return Opened(result.stdout, console)


@dataclass(slots=True)
class Svg:
    """One top-level ``<svg>``: its texts and the data it draws inside the axes."""

    texts: list[str] = field(default_factory=list)
    #: (colour, filled, points) of each path drawn in a data colour, clipped to axes.
    marks: list[tuple[str, bool, list[tuple[float, float]]]] = field(
        default_factory=list
    )

    def lines(self) -> int:
        """Stroked data series with at least two distinct points."""
        return sum(
            1 for _c, filled, pts in self.marks if not filled and len(set(pts)) >= 2
        )

    def areas(self) -> int:
        """Filled data shapes (bars) with a width and a height."""
        count_ = 0
        for _c, filled, pts in self.marks:
            if filled and pts:
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                if max(xs) - min(xs) > 0.5 and max(ys) - min(ys) > 0.5:
                    count_ += 1
        return count_


class PageShape(HTMLParser):
    """What a rendered page holds: its title, tables (body rows of cell texts),
    list items, the elements and attributes it uses, and its top-level SVGs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.tables: list[list[list[str]]] = []
        self.items: list[str] = []
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.svgs: list[Svg] = []
        self._svg_depth = 0
        self._text: list[str] | None = None
        self._row: list[str] | None = None
        self._in_tbody = False
        self._where = ""

    @classmethod
    def parse(cls, text: str) -> PageShape:
        shape = cls()
        shape.feed(text)
        shape.close()
        return shape

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        if tag == "svg":
            if self._svg_depth == 0:
                self.svgs.append(Svg())
            self._svg_depth += 1
        elif self._svg_depth and tag in {"path", "polyline", "polygon", "line"}:
            self._mark(tag, dict(attrs))
        elif tag == "table":
            self.tables.append([])
        elif tag == "tbody":
            self._in_tbody = True
        elif tag == "tr" and self._in_tbody:
            self._row = []
        if tag in {"title", "td", "li", "text"}:
            self._text, self._where = [], tag

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._svg_depth -= 1
        elif tag == "tbody":
            self._in_tbody = False
        elif tag == "tr" and self._row is not None:
            self.tables[-1].append(self._row)
            self._row = None
        if tag == self._where and self._text is not None:
            text = " ".join("".join(self._text).split())
            if tag == "title" and not self._svg_depth:
                self.title = text
            elif tag == "td" and self._row is not None:
                self._row.append(text)
            elif tag == "li":
                self.items.append(text)
            elif tag == "text" and self._svg_depth:
                self.svgs[-1].texts.append(text)
            self._text, self._where = None, ""

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def _mark(self, tag: str, attrs: dict[str, str | None]) -> None:
        if not attrs.get("clip-path"):
            return  # axes, ticks, legends and marker shapes are not clipped to data
        style = dict(
            (k.strip(), v.strip())
            for k, _, v in (
                part.partition(":") for part in (attrs.get("style") or "").split(";")
            )
        )
        fill = (style.get("fill") or attrs.get("fill") or "").lower()
        stroke = (style.get("stroke") or attrs.get("stroke") or "").lower()
        if tag == "path":
            geometry = attrs.get("d") or ""
        elif tag == "line":
            geometry = " ".join(attrs.get(k) or "" for k in ("x1", "y1", "x2", "y2"))
        else:
            geometry = attrs.get("points") or ""
        numbers = [
            float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", geometry)
        ]
        points = list(zip(numbers[::2], numbers[1::2], strict=False))
        if fill in TAB10:
            self.svgs[-1].marks.append((fill, True, points))
        elif stroke in TAB10:
            self.svgs[-1].marks.append((stroke, False, points))


@dataclass(frozen=True, slots=True)
class Page:
    """One page as written and as Chromium rendered it."""

    path: Path
    dom: str
    console: list[str]
    screenshot: Path
    #: URLs the page may name as data: the target the run was pointed at.
    named_targets: frozenset[str]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Page]:
    """Two real runs, ``servemon report`` on one, ``servemon compare`` on both,
    and each page opened in Chromium (DOM dump and screenshot)."""
    work = tmp_path_factory.mktemp("reports")
    ramp = ("ramp", "--sim-profile", "tiny", "--metrics-port", "0", "--seed", "1")
    procs = {
        key: _servemon(
            *ramp, "--stages", STAGES, "--workload", workload, "--out", key, cwd=work
        )
        for key, workload in WORKLOADS.items()
    }
    procs["capacity"] = _servemon(
        *CAPACITY, *ramp[1:], "--workload", WORKLOADS["a"], "--out", "capacity",
        cwd=work,
    )  # fmt: skip
    try:
        for key, proc in procs.items():
            _ok(_finish(proc, 60, f"servemon {key}"), f"servemon {key}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                _kill_group(proc)
    run_a, run_b, run_c = (
        next(p for p in (work / key).iterdir() if p.is_dir()) for key in procs
    )

    report = run_a / "report.html"
    report.unlink()  # so that the page checked is the one `servemon report` writes
    out = _ok(
        _finish(_servemon("report", str(run_a), cwd=work), 60, "report"), "report"
    )
    assert out.strip() == str(report)
    compare = work / "compare.html"
    out = _ok(
        _finish(
            _servemon(
                "compare", str(run_a), str(run_b), "--out", str(compare), cwd=work
            ),
            60,
            "compare",
        ),
        "compare",
    )
    assert f"written: {compare}" in out

    def target(run_dir: Path) -> frozenset[str]:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        return frozenset({run["target"]["url"]})

    found = {}
    for name, path, named in (
        ("report", report, target(run_a)),
        ("compare", compare, frozenset()),
        ("capacity", run_c / "report.html", target(run_c)),
    ):
        dom = _chromium(path, work, "--dump-dom")
        shot = work / f"{name}.png"
        size = f"--window-size={WINDOW[0]},{WINDOW[1]}"
        opened = _chromium(path, work, f"--screenshot={shot}", size)
        found[name] = Page(path, dom.stdout, dom.console + opened.console, shot, named)
    return found


PAGES = pytest.mark.parametrize("name", ["report", "compare", "capacity"])


@PAGES
def test_page_references_nothing_outside_itself(
    pages: dict[str, Page], name: str
) -> None:
    page = pages[name]
    raw = page.path.read_text(encoding="utf-8")
    assert page.path.stat().st_size < 2_000_000
    shape = PageShape.parse(raw)
    scripts = [attrs for tag, attrs in shape.tags if tag == "script"]
    assert scripts == [], "the pages carry no script (docs/capacity.md)"
    outward = [
        (tag, key, value)
        for tag, attrs in shape.tags
        for key, value in attrs
        if key in URL_ATTRIBUTES and not (value or "").startswith(("#", "data:"))
    ]
    assert outward == []
    assert [
        u for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", raw) if u[:1] != "#"
    ] == []
    assert "@import" not in raw


@PAGES
def test_page_names_no_external_url(pages: dict[str, Page], name: str) -> None:
    page = pages[name]
    raw = NAMESPACE_DECLARATION.sub("", page.path.read_text(encoding="utf-8"))
    named = {t.rstrip("/") for t in page.named_targets}
    urls = [u for u in EXTERNAL_URL.findall(raw) if u.rstrip("/") not in named]
    assert urls == []


def test_pages_open_without_console_messages(
    pages: dict[str, Page], tmp_path: Path
) -> None:
    canary = tmp_path / "canary.html"
    canary.write_text(
        "<!doctype html><html><body><svg xmlns='http://www.w3.org/2000/svg'>"
        "<path d='M 0 0 L 10 zz'/></svg>"
        "<script>console.error('servemon-canary-error')</script></body></html>",
        encoding="utf-8",
    )
    caught = _chromium(canary, tmp_path, "--dump-dom").console
    assert any("servemon-canary-error" in line for line in caught), caught
    assert any("<path> attribute d" in line for line in caught), caught

    assert {name: page.console for name, page in pages.items()} == {
        name: [] for name in pages
    }


def test_report_renders_summary_table_and_plots(pages: dict[str, Page]) -> None:
    shape = PageShape.parse(pages["report"].dom)
    assert shape.title.startswith("servemon ramp: ")
    (summary,) = shape.tables
    assert [row[:2] for row in summary] == [
        ["1", LEVELS[0]],
        ["2", LEVELS[1]],
        ["all", ""],
    ]
    for row in summary:
        sent, ok, errors = (int(cell) for cell in row[2:5])
        assert sent == ok > 0, row
        assert errors == 0, row
    assert int(summary[-1][2]) == int(summary[0][2]) + int(summary[1][2])
    vs_load, cdf, scatter, timeline = shape.svgs[:4]
    assert {"Throughput", "Latency (client)"} <= set(vs_load.texts)
    assert {"TTFT CDF", "ITL CDF", "E2E CDF"} <= set(cdf.texts)
    # One curve per level in each of the three panels.
    assert cdf.lines() >= 3 * len(LEVELS), cdf.marks
    assert any(t.startswith("TTFT per request over the run") for t in scatter.texts)
    assert "Target (red) vs achieved request rate" in timeline.texts
    # requests/s, output tokens/s, TTFT p50/p95/p99, ITL p95, E2E p95: two levels each.
    assert vs_load.lines() >= 7, vs_load.marks
    # achieved rate, the target rate per stage, running/waiting, KV usage ...
    assert timeline.lines() >= 4, timeline.marks


def test_compare_renders_table_and_plots(pages: dict[str, Page]) -> None:
    from servemon.loadgen.record.columns import COMPARED

    shape = PageShape.parse(pages["compare"].dom)
    assert shape.title == "servemon compare"
    (table,) = shape.tables
    assert len(table) == len(LEVELS) * len(COMPARED)
    assert sorted({row[0] for row in table}) == LEVELS
    ratios = [row[-1] for row in table if row[1] == "output tok/s"]
    # The ratio, then what it can be judged to be: these short runs of one stage
    # each have too few requests for a verdict, and the page says why.
    assert all(re.fullmatch(r"\d+\.\d\dx too short", r) for r in ratios), ratios
    assert any("not judged, too few requests" in item for item in shape.items)
    assert any(item.startswith("workloads differ") for item in shape.items)
    assert len(shape.svgs) >= 1
    for svg in shape.svgs:
        # One bar per run and level, each with a height.
        assert svg.areas() >= 2 * len(LEVELS), (svg.texts, svg.marks)


def _near(rgb: np.ndarray, colour: tuple[int, int, int], within: int = 30) -> int:
    distance = np.abs(rgb.astype(np.int16) - np.array(colour, dtype=np.int16))
    return int((distance.max(axis=-1) <= within).sum())


@PAGES
def test_screenshot_is_not_blank(pages: dict[str, Page], name: str) -> None:
    image = imread(pages[name].screenshot)
    assert image.shape[:2] == (WINDOW[1], WINDOW[0])
    rgb = (image[..., :3] * 255).round().astype(np.uint8)
    wide = rgb.astype(np.int32)
    packed = (wide[..., 0] << 16) | (wide[..., 1] << 8) | wide[..., 2]
    assert len(np.unique(packed)) > 100  # text anti-aliasing, lines, fills
    assert (rgb.min(axis=-1) < 200).mean() > 0.005  # more than a few marks on white
    # The first two data colours were painted: the plots are not empty frames.
    assert _near(rgb, BLUE) > 200
    assert _near(rgb, ORANGE) > 200


class Marks(HTMLParser):
    """The SVG groups with an id, each with the points of the paths drawn in it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paths: dict[str, list[list[tuple[float, float]]]] = {}
        self._open: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "g":
            self._open.append(dict(attrs).get("id"))
            return
        if tag != "path":
            return
        numbers = [
            float(n)
            for n in re.findall(
                r"-?\d+(?:\.\d+)?(?:e-?\d+)?", dict(attrs).get("d") or ""
            )
        ]
        for gid in filter(None, self._open):
            self.paths.setdefault(gid, []).append(
                list(zip(numbers[::2], numbers[1::2], strict=False))
            )

    def handle_endtag(self, tag: str) -> None:
        if tag == "g" and self._open:
            self._open.pop()


def test_capacity_report_draws_the_decision(pages: dict[str, Page]) -> None:
    """Each tier's thresholds are horizontal lines, its capacity a vertical one on
    latency against load and a marker on the time line, each labelled."""
    dom = pages["capacity"].dom
    marks = Marks()
    marks.feed(dom)
    assert set(marks.paths) >= CAPACITY_MARKS, sorted(marks.paths)
    for gid in CAPACITY_MARKS - {m for m in CAPACITY_MARKS if "-capacity-" in m}:
        (points,) = (p for p in marks.paths[gid] if p)
        xs, ys = {x for x, _ in points}, {y for _, y in points}
        # A threshold is level across its panel, a capacity upright through it.
        across, along = (xs, ys) if gid.startswith("capacity-") else (ys, xs)
        assert len(across) == 1, (gid, points)
        assert max(along) - min(along) > 100, (gid, points)
    shape = PageShape.parse(dom)
    vs_load = next(s for s in shape.svgs if "Latency (client)" in s.texts)
    assert {
        "interactive: TTFT p95 ≤ 2000 ms",
        "interactive: ITL p95 ≤ 1000 ms",
        "batch: E2E p95 ≤ 10000 ms",
        "interactive capacity 8 req/s",
        "batch capacity 8 req/s",
    } <= set(vs_load.texts), vs_load.texts
    # Both tiers' capacities are one step: one line per tier, at the same rate.
    assert (
        len({marks.paths[f"capacity-{t}"][0][0][0] for t in ("interactive", "batch")})
        == 1
    )
