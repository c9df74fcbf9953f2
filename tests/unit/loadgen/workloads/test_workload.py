"""Workload specs, exact prompt lengths, files and request bodies, with fake counters.

The fake counters are plain classes with the ``TokenCounter`` shape: one counts a
word of six letters or more as two tokens (so fitting has work to do), one counts
every word as two tokens (so some lengths cannot be met).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from servemon.core.errors import ConfigError
from servemon.core.fields import layer_config, read_yaml
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.flat import config_of, config_text
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.workloads.prompts import OutputBudget
from servemon.loadgen.workloads.tokens import (
    WORDS,
    EstimateCounter,
    LocalTokenizer,
    TokenCounter,
    count_each,
    estimate_tokens,
)
from servemon.loadgen.workloads.workload import (
    DEFAULT_OUTPUT,
    Prompt,
    Workload,
    WorkloadSpec,
    build_workload,
    chat_body,
    parse_workload,
    random_prompt,
    request_body,
)


class LongWordsCounter:
    """One token a word, two for a word of six letters or more; counts its calls."""

    source = "fake"

    def __init__(self) -> None:
        self.calls = 0

    async def count(self, text: str) -> int:
        self.calls += 1
        return sum(1 + len(word) // 6 for word in text.split())


class PairsCounter:
    """Two tokens every word: odd lengths cannot be met."""

    source = "pairs"

    async def count(self, text: str) -> int:
        return 2 * len(text.split())


async def build(spec: str, counter: Any = None, **kwargs: Any) -> Workload:
    return await build_workload(
        parse_workload(spec),
        counter=counter or LongWordsCounter(),
        seed=kwargs.pop("seed", 7),
        **kwargs,
    )


async def config_error(spec: str) -> str:
    with pytest.raises(ConfigError) as info:
        await build(spec)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("--workload: ")
    return message


# --- spec parsing -------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_unknown_key_is_named_with_the_known_ones() -> None:
    assert await config_error("random:promt=128") == (
        "--workload: random: unknown key 'promt' (known: prompt, output)"
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("random:prompt=abc", "prompt must be an integer >= 1, got 'abc'"),
        ("random:prompt=0", "prompt must be an integer >= 1, got '0'"),
        ("random:prompt", "expected key=value, got 'prompt'"),
        ("random:prompt=4,prompt=5", "'prompt' given twice"),
        ("random:output=9:3", "output must be N or A:B with 1 <= A <= B, got '9:3'"),
        ("random:output=x", "got 'x'"),
        ("random:output=0", "got '0'"),
        ("shared-prefix:groups=2", "unknown key 'groups' (known: prefix, prompts"),
        ("shared-prefix:suffix=-1", "suffix must be an integer >= 0, got '-1'"),
        ("shared-prefix:prompts=0", "prompts must be an integer >= 1"),
        ("bogus:x=1", "unknown kind 'bogus' in 'bogus:x=1'"),
        ("", "unknown kind ''"),
        ("file:", "file: needs a path"),
        ("file:data.jsonl,outptu=3", "file: unknown key 'outptu' (known: output)"),
        ("file:data.jsonl,output=3:1", "file: output must be N or A:B"),
    ],
)
async def test_a_bad_spec_is_one_line_naming_the_key_and_value(
    spec: str, named: str
) -> None:
    assert named in await config_error(spec)


@pytest.mark.asyncio
async def test_defaults_fill_every_missing_key() -> None:
    plain = await build("random", pool_size=4)
    assert plain.spec == "random"
    assert plain.token_source == "fake"
    assert plain.prompt(0).prompt_tokens == 128
    assert plain.prompt(0).max_tokens == DEFAULT_OUTPUT
    shared = await build("shared-prefix:prefix=40")
    assert shared.prompt(0).prompt_tokens == 40 + 64
    assert shared.prompt(0).max_tokens == DEFAULT_OUTPUT
    assert len({(shared.prompt(i).text or "").split()[0] for i in range(8)}) == 8


# --- random -------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("tokens", [1, 5, 64, 500])
async def test_random_prompts_have_exactly_the_asked_length(tokens: int) -> None:
    counter = LongWordsCounter()
    workload = await build(f"random:prompt={tokens},output=16", counter, pool_size=64)
    prompts = [workload.prompt(i) for i in range(64)]
    assert {p.prompt_tokens for p in prompts} == {tokens}
    assert {await LongWordsCounter().count(p.text or "") for p in prompts} == {tokens}
    assert all(p.messages is None and p.max_tokens == 16 for p in prompts)
    if tokens >= 5:
        assert len({p.text for p in prompts}) == 64  # distinct
    # Calibration plus a few counts a prompt.
    assert counter.calls <= 60 + 4 * 64


@pytest.mark.asyncio
async def test_random_prompts_use_varied_words_and_cycle_the_pool() -> None:
    workload = await build("random:prompt=300", pool_size=8)
    three, eleven = workload.prompt(3).text or "", workload.prompt(11).text or ""
    # The same body from the pool, behind a head of the prompt's own.
    assert three.split()[8:] == eleven.split()[8:]
    assert three.split()[:4] != eleven.split()[:4]
    used = {word for i in range(8) for word in (workload.prompt(i).text or "").split()}
    assert len(used & set(WORDS)) > 200


@pytest.mark.asyncio
@pytest.mark.parametrize("counter", [LongWordsCounter(), EstimateCounter()])
async def test_random_prompts_differ_from_their_first_tokens_on(
    counter: TokenCounter,
) -> None:
    # Many times the pool: no two prompts share even their first few words, so a
    # prefix cache (whose blocks are 16 tokens or more) finds nothing to reuse.
    workload = await build("random:prompt=64", counter, pool_size=16)
    heads = [tuple((workload.prompt(i).text or "").split()[:4]) for i in range(5000)]
    assert len(set(heads)) == 5000
    assert len({h[0] for h in heads}) > 10  # not one fixed first word


@pytest.mark.asyncio
async def test_prompts_are_deterministic_per_seed() -> None:
    spec = "random:prompt=50,output=1:100"
    first = await build(spec, seed=3, pool_size=16)
    again = await build(spec, seed=3, pool_size=16)
    other = await build(spec, seed=4, pool_size=16)
    indices = [5, 0, 99, 3, 17, 1000]  # any order: a prompt depends on its index only
    assert [first.prompt(i) for i in indices] == [again.prompt(i) for i in indices]
    assert [first.prompt(i).text for i in range(16)] != [
        other.prompt(i).text for i in range(16)
    ]
    assert [first.prompt(i).max_tokens for i in range(50)] != [
        other.prompt(i).max_tokens for i in range(50)
    ]


@pytest.mark.asyncio
async def test_drawn_output_lengths_cover_the_range_and_stay_inside_it() -> None:
    workload = await build("random:prompt=4,output=10:20", pool_size=4)
    drawn = [workload.prompt(i).max_tokens for i in range(3000)]
    assert min(drawn) == 10
    assert max(drawn) == 20
    assert set(drawn) == set(range(10, 21))
    assert 14.5 < sum(drawn) / len(drawn) < 15.5


@pytest.mark.asyncio
async def test_a_length_that_cannot_be_met_is_the_closest_and_says_so() -> None:
    workload = await build("random:prompt=7", PairsCounter(), pool_size=8)
    for i in range(8):
        prompt = workload.prompt(i)
        assert prompt.prompt_tokens in (6, 8)
        assert prompt.prompt_tokens == await PairsCounter().count(prompt.text or "")
    assert workload.token_source == "pairs"


@pytest.mark.asyncio
async def test_under_the_estimate_lengths_are_as_close_as_it_allows() -> None:
    workload = await build("random:prompt=128", EstimateCounter(), pool_size=8)
    assert workload.token_source == "estimate"
    for i in range(8):
        prompt = workload.prompt(i)
        assert prompt.prompt_tokens == estimate_tokens(prompt.text or "")
        assert abs(128 - (prompt.prompt_tokens or 0)) <= 1  # 98 words: 127, 99: 129


# --- shared-prefix ------------------------------------------------------------


@pytest.mark.asyncio
async def test_shared_prefix_groups_share_a_prefix_and_suffixes_are_unique() -> None:
    counter = LongWordsCounter()
    workload = await build(
        "shared-prefix:prefix=50,prompts=4,suffix=16,output=8", counter
    )
    prompts = [workload.prompt(i) for i in range(400)]
    split = [(p.text or "").split() for p in prompts]
    prefixes = [" ".join(words[:-16]) for words in split]
    suffixes = [" ".join(words[-16:]) for words in split]
    for i, prefix in enumerate(prefixes):
        assert prefix == prefixes[i % 4]
        assert await counter.count(prefix) == 50
    assert len(set(prefixes)) == 4
    assert len(set(suffixes)) == 400
    for prompt in prompts[:20]:
        assert prompt.prompt_tokens == 66 == await counter.count(prompt.text or "")
        assert prompt.max_tokens == 8


@pytest.mark.asyncio
async def test_shared_prefix_without_one_token_words_leaves_the_length_unknown() -> (
    None
):
    workload = await build("shared-prefix:prefix=10,prompts=2,suffix=6", PairsCounter())
    prompt = workload.prompt(0)
    assert prompt.prompt_tokens is None
    assert (prompt.text or "").split()[:5] == (workload.prompt(2).text or "").split()[
        :5
    ]


@pytest.mark.asyncio
async def test_shared_prefix_under_the_estimate_reports_the_estimate() -> None:
    workload = await build("shared-prefix:prefix=100,suffix=20", EstimateCounter())
    for i in range(10):
        prompt = workload.prompt(i)
        assert prompt.prompt_tokens == estimate_tokens(prompt.text or "")
        assert abs((prompt.prompt_tokens or 0) - 120) <= 2


# --- file ---------------------------------------------------------------------


def write_lines(path: Path, *items: object) -> Path:
    path.write_text(
        "\n".join(item if isinstance(item, str) else json.dumps(item) for item in items)
        + "\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.asyncio
async def test_jsonl_prompts_and_messages_in_file_order(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "data.jsonl",
        {"prompt": "one two three", "max_tokens": 5},
        "",
        {"prompt": "tokens seventeen", "output_tokens": 9},
        "   ",
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "why is the sky blue"},
            ]
        },
    )
    workload = await build(f"file:{path}")
    assert workload.spec == f"file:{path}"
    assert workload.token_source == "fake"
    first, second, third = (workload.prompt(i) for i in range(3))
    assert first == Prompt("one two three", None, 3, 5)
    assert second == Prompt("tokens seventeen", None, 2 + 2, 9)  # long words: 2
    assert third.text is None
    assert third.messages == (
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "why is the sky blue"},
    )
    assert third.prompt_tokens == 2 + 5  # contents only, no template
    assert third.max_tokens == DEFAULT_OUTPUT
    assert workload.prompt(3) == first
    assert workload.prompt(302) == third


SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "you are terse"},
            {"from": "human", "value": "name three colours"},
            {"from": "gpt", "value": "red green and blue"},
            {"from": "human", "value": "and three more"},
            {"from": "gpt", "value": "cyan magenta yellow"},
        ],
    },
    {"id": "empty", "conversations": []},
    {"id": "reply-first", "conversations": [{"from": "gpt", "value": "hello"}]},
    {
        "id": "b",
        "conversations": [
            {"from": "user", "value": "count to two"},
            {"from": "assistant", "value": "one two"},
        ],
    },
    {"id": "c", "conversations": [{"from": "human", "value": "unanswered"}]},
    {"id": "d", "max_tokens": 12, "conversations": [{"from": "human", "value": "x"}]},
]


@pytest.mark.asyncio
async def test_a_sharegpt_array_gives_first_turns_and_reply_lengths(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT, indent=2), encoding="utf-8")
    workload = await build(f"file:{path}")
    a, b, c, d = (workload.prompt(i) for i in range(4))
    assert a.messages == (
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": "name three colours"},
    )
    assert a.prompt_tokens == 3 + 4  # "colours" is 2 tokens for the fake
    assert a.max_tokens == 4  # "red green and blue"
    assert b.messages == ({"role": "user", "content": "count to two"},)
    assert b.max_tokens == 2
    assert c.max_tokens == DEFAULT_OUTPUT  # no reply: the default
    assert d.max_tokens == 12
    assert workload.prompt(4) == a  # the skipped conversations are not entries


@pytest.mark.asyncio
async def test_sharegpt_lines_in_jsonl_and_an_output_override(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "mixed.jsonl", *SHAREGPT)
    fixed = await build(f"file:{path},output=6")
    assert [fixed.prompt(i).max_tokens for i in range(8)] == [6] * 8
    drawn = await build(f"file:{path},output=3:5")
    budgets = {drawn.prompt(i).max_tokens for i in range(200)}
    assert budgets == {3, 4, 5}
    assert drawn.prompt(0).messages == fixed.prompt(0).messages


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ('{"prompt": "fine"', "line 3: invalid JSON"),
        ('["a list"]', "line 3: expected a JSON object, got an array"),
        ('{"text": "no prompt"}', "line 3: expected 'prompt', 'messages' or"),
        ('{"prompt": ""}', "line 3: 'prompt' must be a non-empty string"),
        ('{"prompt": "x", "max_tokens": 0}', "line 3: 'max_tokens' must be an integer"),
        ('{"prompt": "x", "output_tokens": true}', "line 3: 'output_tokens' must be"),
        ('{"messages": []}', "line 3: 'messages' must be a non-empty list"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', "messages[0].role must"),
        ('{"messages": [{"role": "user", "content": 3}]}', "content must be a string"),
        ('{"conversations": [{"from": "human"}]}', "conversations[0] must be an obj"),
    ],
)
async def test_a_bad_line_names_the_file_and_line(
    tmp_path: Path, bad: str, named: str
) -> None:
    path = write_lines(tmp_path / "bad.jsonl", {"prompt": "a"}, "", bad)
    message = await config_error(f"file:{path}")
    assert message.startswith(f"--workload: file: {path}: ")
    assert named in message


@pytest.mark.asyncio
async def test_unreadable_empty_and_broken_files_are_config_errors(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing.jsonl"
    assert "cannot read" in await config_error(f"file:{missing}")
    empty = write_lines(tmp_path / "empty.jsonl", "", "")
    assert "no prompts" in await config_error(f"file:{empty}")
    array = tmp_path / "broken.json"
    array.write_text('[\n  {"prompt": "a"},\n  {"prompt": }\n]', encoding="utf-8")
    assert f"{array}: line 3: invalid JSON" in await config_error(f"file:{array}")
    items = tmp_path / "items.json"
    items.write_text('[{"prompt": "a"}, 5]', encoding="utf-8")
    assert f"{items}: item 2: expected a JSON object" in await config_error(
        f"file:{items}"
    )


# --- request bodies -----------------------------------------------------------


TEXT = Prompt("say hi", None, 2, 12)
CHAT = Prompt(
    None,
    ({"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}),
    3,
    7,
)


def body(prompt: Prompt, api: Any, **kwargs: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "model": "m",
        "stream": True,
        "ignore_eos": False,
        "extra_body": None,
    }
    options.update(kwargs)
    return request_body(prompt, api=api, **options)


def test_chat_bodies_carry_messages_or_one_user_message() -> None:
    assert body(TEXT, "chat") == {
        "model": "m",
        "messages": [{"role": "user", "content": "say hi"}],
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = body(CHAT, "chat", stream=False, ignore_eos=True)
    assert sent == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be kind"},
            {"role": "user", "content": "hi"},
        ],
        "max_tokens": 7,
        "stream": False,
        "ignore_eos": True,
    }
    sent["messages"][0]["content"] = "changed"
    assert CHAT.messages is not None
    assert CHAT.messages[0]["content"] == "be kind"


def test_completion_bodies_carry_the_text_or_the_joined_contents() -> None:
    assert body(TEXT, "completions", stream=False) == {
        "model": "m",
        "prompt": "say hi",
        "max_tokens": 12,
        "stream": False,
    }
    assert body(CHAT, "completions")["prompt"] == "be kind\n\nhi"


def test_extra_body_is_merged_last_and_deeply() -> None:
    extra = {
        "stream_options": {"continuous_usage_stats": True},
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 99,
    }
    sent = body(TEXT, "chat", extra_body=extra)
    assert sent["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    assert sent["max_tokens"] == 99
    sent["chat_template_kwargs"]["enable_thinking"] = True
    assert extra["chat_template_kwargs"] == {"enable_thinking": False}
    replaced = body(TEXT, "chat", extra_body={"stream_options": 5})
    assert replaced["stream_options"] == 5


def test_chat_body_and_random_prompt_keep_their_behaviour() -> None:
    assert chat_body("m", "hi", 4) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert chat_body("m", "hi", 4, stream=False, ignore_eos=True)["ignore_eos"]
    text = random_prompt(random.Random(1), 10)
    assert len(text.split()) == 10
    assert text == random_prompt(random.Random(1), 10)


# --- counters -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_estimate_is_words_times_1_3_rounded() -> None:
    counter = EstimateCounter()
    assert counter.source == "estimate"
    assert await counter.count("a b c") == 4
    assert await counter.count("  ") == 0
    assert await counter.count(" ".join(["w"] * 100)) == 130


@pytest.mark.asyncio
async def test_count_each_keeps_order_and_skips_empty_texts() -> None:
    counter = LongWordsCounter()
    texts = ["", "a b", "letters", ""] * 10
    assert await count_each(counter, texts) == [0, 2, 2, 0] * 10
    assert counter.calls == 20


def test_a_missing_tokenizers_package_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now fails
    with pytest.raises(ConfigError, match=r"^--tokenizer: needs the 'tokenizers'"):
        LocalTokenizer(tmp_path / "tokenizer.json")


def test_an_unreadable_tokenizer_file_is_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        LocalTokenizer(path)
    assert str(info.value).startswith(f"--tokenizer: {path}: cannot load")
    assert "\n" not in str(info.value)


def train_bpe(path: Path, vocab_size: int) -> Path:
    """A small BPE tokenizer trained here on the word lists, saved as JSON."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]"], show_progress=False
    )
    common = "the of and to in is that for it as was with be by on not he this are"
    text = [" ".join(WORDS), common, common, common]
    tokenizer.train_from_iterator(text, trainer=trainer)
    tokenizer.save(str(path))
    return path


@pytest.mark.asyncio
async def test_a_local_bpe_tokenizer_counts_and_fits_exact_lengths(
    tmp_path: Path,
) -> None:
    counter = LocalTokenizer(train_bpe(tmp_path / "tokenizer.json", 400))
    assert counter.source == "tokenizer"
    assert await counter.count("the") == 1
    long_words = await counter.count("umbrella knowledge hospital")
    assert long_words > 3  # the small vocabulary splits long words
    workload = await build("random:prompt=200", counter, pool_size=16)
    assert workload.token_source == "tokenizer"
    for i in range(16):
        prompt = workload.prompt(i)
        assert prompt.prompt_tokens == 200 == await counter.count(prompt.text or "")
    shared = await build("shared-prefix:prefix=100,prompts=2,suffix=20", counter)
    for i in range(6):
        prompt = shared.prompt(i)
        assert prompt.prompt_tokens == 120 == await counter.count(prompt.text or "")


def test_the_workload_is_parsed_once_where_the_config_is_built() -> None:
    """The config holds the parsed spec (every user reads its kind and options from
    it); the record keeps the text; a bad spec fails as the config is built."""
    config = LoadConfig(workload="sessions:turns=2,user=8")  # type: ignore[arg-type]
    assert isinstance(config.workload, WorkloadSpec)
    assert config.workload.sessions is not None
    assert config.workload.trace_path is None
    assert config_text(config)["workload"] == "sessions:turns=2,user=8"
    flat = {**config_text(config), "workload": config.workload}
    again = config_of("ramp", ("run.json", flat))
    assert again.workload is config.workload  # a parsed spec passes through
    with pytest.raises(ConfigError, match="prompt must be an integer"):
        LoadConfig(workload="random:prompt=abc")  # type: ignore[arg-type]


def test_the_selector_and_the_model_mix_are_parsed_once() -> None:
    """``--select`` is parsed where the config is built (its matchers, a comma
    inside quotes kept, joined back for the record); ``--model``'s mix once, when
    the config is built (:class:`~servemon.loadgen.run.choices.ModelChoice`)."""
    text = '{model="a,b", target=~"pool-a.*"}'
    config = LoadConfig(select=text, prometheus="http://127.0.0.1:9")  # type: ignore[arg-type]
    assert config.select == ('model="a,b"', 'target=~"pool-a.*"')
    recorded = config_text(config)["select"]
    assert LoadConfig(select=recorded).select == config.select  # type: ignore[arg-type]
    mixed = LoadConfig(model="a=0.7,b=0.3")  # type: ignore[arg-type]
    assert mixed.model is not None
    assert mixed.model.mix is not None
    assert (mixed.model.mix.names, mixed.model.name) == (("a", "b"), None)
    assert config_text(mixed)["model"] == "a=0.7,b=0.3"
    one = config_of("ramp", ("flags", {"model": "a"}))
    assert one.model is not None
    assert (one.model.mix, one.model.name) == (None, "a")
    assert config_of("ramp", ("run.json", config_text(one))) == one
    with pytest.raises(ConfigError, match=r"^--model: expected NAME=WEIGHT"):
        config_of("ramp", ("flags", {"model": "a=1,b"}))


def test_parsed_settings_survive_every_config_layer(tmp_path: Path) -> None:
    """Defaults, a YAML file, then flags (layer_config; config_of for a load
    command): each layer keeps the parsed workload and hold as they are (a layer
    that took them apart field by field left a workload whose output budget was a
    dict, and every run without --workload broke)."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text("workload: random:prompt=16,output=4\nhold: waiting=3\n")
    layered = config_of(
        "control",
        (str(config_file), read_yaml(config_file)),
        ("command line", {"duration": 5.0}),
    )
    assert layered.workload.options["output"] == OutputBudget(4, 4)
    assert layered.control is not None
    assert layered.control.hold.setpoint == 3.0
    plain = layer_config(LoadConfig, None, {"seed": 5})
    assert isinstance(plain.workload.options["output"], OutputBudget)


@pytest.mark.asyncio
async def test_a_prompt_file_is_read_once(tmp_path: Path) -> None:
    """Checked (every line) when the run is planned and built from that one read:
    the file can be gone by the time the prompts are built."""
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "one two three"}\n{"prompt": "four five"}\n')
    config = config_of("ramp", ("flags", {"workload": f"file:{path}"}))
    make_plan("ramp", config)
    path.unlink()
    workload = await build_workload(config.workload, counter=LongWordsCounter(), seed=1)
    assert workload.prompt(1).text == "four five"
