"""Engine expositions, drawn and mutated, against prometheus_client as the oracle.

Drawn expositions are valid text 0.0.4 (or OpenMetrics-flavoured text: ``# UNIT``,
``# EOF``, exemplar-free) with what engines put in them and what the format allows:
escaped label values, NaN and infinities, huge values, timestamps, duplicate
series, families without ``# TYPE`` or ``# HELP``, families interleaved. Mutations
cut them at any byte, drop, repeat and swap lines, and put in bytes that are not
UTF-8. Properties:

- servemon's parser reads exactly what prometheus_client's parser reads (names,
  types, labels, values), and refuses (ValueError, nothing else) what it refuses;
- the normalizer gives what the rules make of prometheus_client's parse, or raises
  ValueError; its output, as the exporter writes it in every format a scraper may
  ask for, parses with prometheus_client's parsers (OpenMetrics with its own);
- over a real socket, the engine collector marks a target whose body the oracle
  refuses down with ``reason="parse"`` and serves none of it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from servemon.monitor.engine import EngineCollector, Target
from servemon.monitor.exposition import ExpositionParser
from servemon.monitor.normalize import Normalizer
from servemon.monitor.render import Encoder, Renderer
from tests.support.oracle import comparable, family_rows, oracle, parsed

pytestmark = pytest.mark.fuzz

#: How scrapers ask (as in the oracle tests): OpenMetrics, text 0.0.4, text with
#: UTF-8 names, no preference.
ACCEPTS = (
    "application/openmetrics-text; version=1.0.0",
    "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "",
)
FORMATS: list[tuple[Encoder, str]] = [choose_encoder(a) for a in ACCEPTS]

#: Names the rules know (so that normalizing maps them), and some they do not.
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:num_running_reqs",
    "tgi_queue_size",
    "process_open_fds",
    "x",
)
COUNTERS = (
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "other_total_things",
)
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:inter_token_latency_seconds",
    "foo_seconds",
)
LABEL_NAMES = ("model_name", "engine", "finished_reason", "le_x", "a")

label_values = st.text(
    st.one_of(
        st.sampled_from('\\"\n{}=, #\t'),
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
    ),
    max_size=6,
)
#: Sample values as engines and the format write them.
value_texts = st.one_of(
    st.floats().map(repr),
    st.floats(allow_nan=False).map(lambda v: f"{v:e}"),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(
        ["NaN", "+Inf", "-Inf", "-0", "1e308", "1e400", "5e-324", "0.0", "17", "9" * 40]
    ),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _labels(draw: st.DrawFn, extra: dict[str, str] | None = None) -> str:
    names = draw(st.lists(st.sampled_from(LABEL_NAMES), unique=True, max_size=3))
    pairs = {n: draw(label_values) for n in names}
    pairs.update(extra or {})
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())
    return "{" + inner + ("," if draw(st.booleans()) else "") + "}"


@st.composite
def _sample(draw: st.DrawFn, name: str, extra: dict[str, str] | None = None) -> str:
    line = f"{name}{draw(_labels(extra))} {draw(value_texts)}"
    if draw(st.integers(0, 9)) == 0:
        line += f" {draw(st.integers(0, 2**41))}"  # a timestamp, in ms
    return line


@st.composite
def _family(draw: st.DrawFn, coherent: bool = False) -> list[str]:
    """One family's lines; ``coherent``: values as an engine's own counters and
    histograms hold them (whole, cumulative bucket counts, the count equal to the
    +Inf bucket, nothing negative or NaN), no timestamps."""
    kind = draw(st.sampled_from(["gauge", "counter", "histogram", "untyped"]))
    if kind == "gauge" or kind == "untyped":
        name = draw(st.sampled_from(GAUGES))
        samples = [name] * draw(st.integers(1, 3))
    elif kind == "counter":
        name = draw(st.sampled_from(COUNTERS))
        samples = [name + "_total"] * draw(st.integers(1, 3))
    else:
        name = draw(st.sampled_from(HISTOGRAMS))
        samples = []
    lines: list[str] = []
    if draw(st.booleans()):
        doc = _escape(draw(label_values)).replace('\\"', '"')
        lines.append(f"# HELP {name} {doc}")
    if kind != "untyped" and draw(st.integers(0, 4)) > 0:  # now and then no TYPE
        lines.append(f"# TYPE {name} {kind}")
    if draw(st.integers(0, 5)) == 0:
        lines.append(f"# UNIT {name} seconds")  # OpenMetrics: a comment to 0.0.4
    if not coherent:
        lines += [draw(_sample(s)) for s in samples]
        if kind == "histogram":
            for edge in draw(st.sampled_from([["0.1", "1.0", "+Inf"], ["+Inf"], []])):
                lines.append(draw(_sample(name + "_bucket", {"le": edge})))
            lines.append(draw(_sample(name + "_sum")))
            lines.append(draw(_sample(name + "_count")))
        return lines
    labels = draw(_labels())
    counts = st.integers(0, 10**6)
    if kind == "counter":
        lines.append(f"{name}_total{labels} {draw(counts)}")
    elif kind == "histogram":
        total = 0
        for edge in ("0.1", "1.0", "+Inf"):
            total += draw(counts)
            le = f'le="{edge}"'
            with_le = labels[:-1] + "," + le + "}" if labels else "{" + le + "}"
            lines.append(f"{name}_bucket{with_le.replace(',,', ',')} {total}")
        lines.append(f"{name}_sum{labels} {draw(st.floats(0, 1e9))!r}")
        lines.append(f"{name}_count{labels} {total}")
    else:
        lines.append(f"{name}{labels} {draw(value_texts)}")
    return lines


def _name_of(family: list[str]) -> str:
    """A drawn family's name (the first word of its last line)."""
    return family[-1].partition("{")[0].partition(" ")[0].removesuffix("_count")


@st.composite
def expositions(draw: st.DrawFn, coherent: bool = False) -> str:
    """A valid exposition: families, maybe interleaved or repeated (``coherent``:
    neither, and values an engine's counters and histograms could hold)."""
    families = draw(st.lists(_family(coherent), max_size=5))
    if coherent:  # no series twice: one family of each name
        families = list({_name_of(f): f for f in reversed(families)}.values())
    lines = [line for family in families for line in family]
    if lines and not coherent and draw(st.booleans()):  # interleave, or repeat a series
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines)))
        lines.insert(j, lines[i])
    text = "\n".join(lines) + ("\n" if lines else "")
    if draw(st.integers(0, 5)) == 0:
        text += "# EOF\n"  # OpenMetrics' end: a comment to 0.0.4
    return text


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A drawn exposition's bytes, broken: cut, lines dropped, repeated or swapped,
    bytes inserted (not always UTF-8), bytes changed."""
    body = draw(expositions()).encode()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 5))
        at = draw(st.integers(0, len(body)))
        if kind == 0:
            body = body[:at]
        elif kind == 1:
            lines = body.split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if draw(st.booleans()):
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines.insert(j, lines[i])
            body = b"\n".join(lines)
        elif kind == 2:
            lines = body.split(b"\n")
            del lines[draw(st.integers(0, len(lines) - 1))]
            body = b"\n".join(lines)
        elif kind == 3:
            junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80"]))
            body = body[:at] + junk + body[at:]
        else:
            junk = draw(st.binary(max_size=3) | st.sampled_from(list(b'{}",= \t#\\')))
            piece = junk if isinstance(junk, bytes) else bytes([junk])
            body = body[:at] + piece + body[at + 1 :]
    return body


def _text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


def _library(text: str) -> dict[str, list[Any]] | None:
    """prometheus_client's families by name (a later one replaces an earlier one,
    untyped ones are joined), comparable; None where it refuses the text."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:  # the oracle refusing, however it says so
        return None
    out: dict[str, list[Any]] = {}
    for f in families:
        samples = [
            (s.name, sorted(s.labels.items()), comparable(s.value), s.timestamp)
            for s in f.samples
        ]
        earlier = out.get(f.name)
        if earlier is not None and f.type == "unknown" == earlier[1]:
            earlier[3] += samples
        else:
            out[f.name] = [f.name, f.type, f.documentation, samples]
    return out


def _ours(families: dict[str, Metric]) -> dict[str, list[Any]]:
    return {
        name: [
            f.name,
            f.type,
            f.documentation,
            [
                (s.name, sorted(s.labels.items()), comparable(s.value), s.timestamp)
                for s in f.samples
            ],
        ]
        for name, f in families.items()
    }


texts = st.one_of(expositions(), mutated().map(_text))


@given(text=texts)
def test_the_parser_reads_what_prometheus_client_reads(text: str) -> None:
    want = _library(text)
    parser = ExpositionParser()
    if want is None:
        with pytest.raises(ValueError):  # noqa: PT011 (the contract names it)
            parser.parse(text)
        return
    assert _ours(parser.parse(text)) == want
    assert _ours(parser.parse(text)) == want  # again, from the remembered lines


#: What prometheus_client's OpenMetrics parser says of values that break
#: OpenMetrics' rules for counters and histograms (fractional or negative counts, a
#: count unequal to the +Inf bucket, NaN): an engine's values, passed on as they
#: are, by the library's own encoder too. Anything else it says of the exporter's
#: answer is a fault of the answer.
VALUE_RULES = (
    "Bucket value must be an integer",
    "Count value must be an integer",
    "Counter-like samples cannot be",
    "+Inf bucket missing",
    "Count does not match +Inf value",
    "Bucket values out of order",
    "must be present if",
    "Cannot have _sum with negative buckets",
)


def _check_written(written: str, content_type: str) -> None:
    """The exporter's answer parses with prometheus_client's parser for its format
    (text: always; OpenMetrics: but for the engine's own values, see VALUE_RULES)."""
    got = parsed(written, content_type)
    if not isinstance(got, tuple):
        return
    assert content_type.startswith("application/openmetrics-text"), (got, written)
    assert any(rule in got[1] for rule in VALUE_RULES), (got, written)


def _written(result: Any, encoder: Encoder, content_type: str) -> str:
    renderer = Renderer()
    return renderer.render([result], encoder, content_type) + renderer.trailer(
        encoder, content_type
    )


@given(sequence=st.lists(texts, min_size=1, max_size=3))
def test_normalizing_gives_the_oracles_families_and_parseable_output(
    sequence: list[str],
) -> None:
    """One normalizer over a sequence (its plans come and go): each exposition gives
    what the rules make of prometheus_client's parse, or ValueError where either
    refuses; whatever it gives is written as text the library's parsers read."""
    normalizer = Normalizer()
    for text in sequence:
        try:
            want = oracle(text, target="t")
        except ValueError:
            with pytest.raises(ValueError):  # noqa: PT011 (the contract names it)
                normalizer.normalize(text, target="t")
            continue
        ours = normalizer.normalize(text, target="t")
        assert family_rows(ours.families) == family_rows(want.families)
        assert (ours.engine, ours.dialect, ours.models) == (
            want.engine,
            want.dialect,
            want.models,
        )
        for encoder, content_type in FORMATS:
            _check_written(_written(ours, encoder, content_type), content_type)


@given(text=expositions(coherent=True))
def test_coherent_values_are_written_as_strict_openmetrics(text: str) -> None:
    """Values an engine's own counters and histograms can hold: the OpenMetrics
    answer passes prometheus_client's strict parser, every check included."""
    ours = Normalizer().normalize(text, target="t")
    for encoder, content_type in FORMATS:
        written = _written(ours, encoder, content_type)
        assert not isinstance(parsed(written, content_type), tuple), written


# -- over a real socket: the collector ----------------------------------------------


def _strict(body: bytes) -> str | None:
    """The body as the oracle reads it: UTF-8 (the format's encoding), else None."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


async def _served(body: bytes) -> tuple[dict[str, float], list[str], str]:
    """Serve ``body`` as a target's /metrics on 127.0.0.1 and scrape it once with the
    engine collector: (up, errors by reason), servemon's engine family names, and
    the exporter's answer in each format (checked to parse)."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    target = Target(url=f"http://{host}:{port}", name="t")
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=10), trust_env=False
        ) as session:
            collector = EngineCollector([target], session, timeout_s=5.0)
            try:
                scrape = await collector.collect()
                answers = [
                    collector.encode(scrape, encoder, content_type).decode()
                    for encoder, content_type in FORMATS
                ]
            finally:
                await collector.close()
    finally:
        await runner.cleanup()
    figures: dict[str, float] = {}
    for family in scrape.targets:
        for s in family.samples:
            key = s.name + ("/" + s.labels["reason"] if "reason" in s.labels else "")
            figures[key] = s.value
    engine = sorted({f.name for result in scrape.results for f in result.families})
    for answer, (_, content_type) in zip(answers, FORMATS, strict=True):
        _check_written(answer, content_type)
    return figures, engine, answers[1]


@settings(
    max_examples=max(5, settings.default.max_examples // 4),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(body=st.one_of(expositions().map(str.encode), mutated()))
# Not UTF-8 (the format's encoding): was read with U+FFFD in place of the byte and
# served, up 1 (found by the long profile).
@example(body=b"#\xff EOF\n")
@example(body=b'vllm:num_requests_running{model_name="q\xff"} 1\n')
def test_the_collector_serves_what_the_oracle_reads_or_nothing(body: bytes) -> None:
    figures, engine, answer = asyncio.run(_served(body))
    text = _strict(body)
    want = None
    if text is not None:
        try:
            want = oracle(text, target="t")
        except ValueError:
            want = None
    if want is None:
        assert figures["servemon_target_up"] == 0.0
        assert figures["servemon_target_scrape_errors_total/parse"] == 1.0
        assert engine == []
        assert "servemon_engine_" not in answer.replace("servemon_engine_info", "")
        return
    assert figures["servemon_target_up"] == 1.0
    assert figures["servemon_target_scrape_errors_total/parse"] == 0.0
    assert engine == sorted({f.name for f in want.families})


def _all_values(text: str) -> Iterator[float]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.value


def test_a_drawn_exposition_can_carry_what_the_brief_lists() -> None:
    """The strategy reaches NaN, infinities and escapes (a check on the drawing)."""
    seen: set[str] = set()

    @settings(max_examples=200, database=None)
    @given(text=expositions())
    def draw(text: str) -> None:
        for value in _all_values(text):
            if math.isnan(value):
                seen.add("nan")
            elif math.isinf(value):
                seen.add("inf")
        if "\\n" in text or '\\"' in text:
            seen.add("escape")
        if "# TYPE" not in text and text:
            seen.add("untyped")

    draw()
    assert seen == {"nan", "inf", "escape", "untyped"}
