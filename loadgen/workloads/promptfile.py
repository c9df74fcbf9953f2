"""``file:PATH``: prompts from a JSONL (or JSON array) file of prompts, chat
messages or ShareGPT conversations (see :mod:`servemon.loadgen.workloads.workload`);
every line checked, a bad one named."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.prompts import OutputBudget, Prompt, Workload
from servemon.loadgen.workloads.tokens import TokenCounter, count_each

__all__ = [
    "Conversation",
    "FileEntry",
    "build_file",
    "json_items",
    "read_conversations",
    "read_entries",
    "read_text",
]

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_HUMAN = frozenset({"human", "user"})
_REPLY = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One parsed object of a workload file, before counting."""

    text: str | None
    messages: tuple[dict[str, str], ...] | None
    max_tokens: int | None
    reply: str | None


@dataclass(frozen=True, slots=True)
class _FileWorkload:
    """``file``: the file's entries in order, cycled."""

    spec: str
    token_source: str
    seed: int
    prompts: tuple[Prompt, ...]
    output: OutputBudget | None  # overrides the file's budgets when given

    def prompt(self, index: int) -> Prompt:
        """Entry ``index % entries``, its budget overridden when ``output=`` given."""
        found = self.prompts[index % len(self.prompts)]
        if self.output is None:
            return found
        return replace(found, max_tokens=self.output.draw(self.seed, index))


async def build_file(
    spec: str,
    counter: TokenCounter,
    seed: int,
    entries: Sequence[FileEntry],
    output: OutputBudget | None,
    default_output: int,
) -> Workload:
    """The workload of a prompt file's ``entries`` (read once, by the spec)."""
    # Every text to count in one list: each entry's contents, then its reply (the
    # empty text, not counted, where the budget comes from elsewhere).
    texts: list[str] = []
    for entry in entries:
        texts += [m["content"] for m in entry.messages or ()] or [entry.text or ""]
        by_reply = entry.max_tokens is None and output is None
        texts.append((entry.reply or "") if by_reply else "")
    counts = iter(await count_each(counter, texts))
    prompts: list[Prompt] = []
    for entry in entries:
        parts = len(entry.messages) if entry.messages is not None else 1
        tokens = sum(next(counts) for _ in range(parts))
        reply = next(counts)
        budget = entry.max_tokens or (max(reply, 1) if reply else default_output)
        prompts.append(Prompt(entry.text, entry.messages, tokens, budget))
    return _FileWorkload(spec, counter.source, seed, tuple(prompts), output)


#: What json says of an integer past Python's limit on digits (a ValueError that is
#: not a JSONDecodeError).
_LONG_NUMBER = "a number with too many digits"


def read_text(path: Path, where: str) -> str:
    """A workload or trace file's text; one line naming it if it cannot be read."""
    try:
        return path.expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None


def read_entries(path: Path) -> list[FileEntry]:
    where = f"--workload: file: {path}"
    found = [_entry(item, at) for item, at in json_items(read_text(path, where), where)]
    entries = [entry for entry in found if entry is not None]
    if not entries:
        raise ConfigError(f"{where}: no prompts in the file")
    return entries


def json_items(content: str, where: str) -> Iterator[tuple[object, str]]:
    """Each item of a JSONL text, or of a whole-text JSON array, with where it is
    (``WHERE: line N`` or ``WHERE: item N``); invalid JSON is a one-line error."""
    if content.lstrip().startswith("["):
        try:
            items = json.loads(content)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{where}: line {exc.lineno}: invalid JSON: {exc.msg}"
            ) from None
        except RecursionError:
            raise ConfigError(f"{where}: JSON nested too deeply") from None
        except ValueError:  # not a JSONDecodeError: past int()'s digit limit
            raise ConfigError(f"{where}: invalid JSON: {_LONG_NUMBER}") from None
        for n, item in enumerate(items, 1):
            yield item, f"{where}: item {n}"
        return
    for number, line in enumerate(content.split("\n"), 1):
        if not line.strip():
            continue
        line_where = f"{where}: line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{line_where}: invalid JSON: {exc.msg}") from None
        except RecursionError:
            raise ConfigError(f"{line_where}: JSON nested too deeply") from None
        except ValueError:
            raise ConfigError(f"{line_where}: invalid JSON: {_LONG_NUMBER}") from None
        yield item, line_where


def _entry(item: object, where: str) -> FileEntry | None:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {_kind(item)}")
    budget = _budget(item, where)
    if "prompt" in item:
        prompt = item["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ConfigError(f"{where}: 'prompt' must be a non-empty string")
        return FileEntry(prompt, None, budget, None)
    if "messages" in item:
        return FileEntry(None, _messages(item["messages"], where), budget, None)
    if "conversations" in item:
        return _sharegpt(item, budget, where)
    raise ConfigError(
        f"{where}: expected 'prompt', 'messages' or 'conversations' (ShareGPT)"
    )


def _budget(item: Mapping[str, object], where: str) -> int | None:
    for key in ("max_tokens", "output_tokens"):
        if key in item:
            value = item[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{where}: {key!r} must be an integer >= 1, got {value!r}"
                )
            return value
    return None


def _messages(value: object, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list")
    messages: list[dict[str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ConfigError(f"{where}: messages[{i}] must be an object")
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise ConfigError(
                f"{where}: messages[{i}].role must be one of "
                f"{', '.join(sorted(_ROLES))}, got {role!r}"
            )
        if not isinstance(content, str):
            raise ConfigError(f"{where}: messages[{i}].content must be a string")
        messages.append({"role": role, "content": content})
    return tuple(messages)


def _sharegpt(
    item: Mapping[str, object], budget: int | None, where: str
) -> FileEntry | None:
    turns = item["conversations"]
    if not isinstance(turns, list):
        raise ConfigError(f"{where}: 'conversations' must be a list")
    given = item.get("system")
    system = given if isinstance(given, str) else None
    human: str | None = None
    reply: str | None = None
    for i, turn in enumerate(turns):
        if not (
            isinstance(turn, dict)
            and isinstance(turn.get("from"), str)
            and isinstance(turn.get("value"), str)
        ):
            raise ConfigError(
                f"{where}: conversations[{i}] must be an object with string "
                "'from' and 'value'"
            )
        who, value = turn["from"].lower(), turn["value"]
        if human is None:
            if who == "system":
                system = value
            elif who in _HUMAN:
                human = value
        elif reply is None and who in _REPLY:
            reply = value
        elif reply is None and who in _HUMAN:
            reply = ""  # a second question before any answer: no reply to measure
    if human is None or not human.strip():
        return None  # ShareGPT dumps hold empty and reply-first conversations
    messages = [{"role": "user", "content": human}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return FileEntry(None, tuple(messages), budget, reply or None)


@dataclass(frozen=True, slots=True)
class Conversation:
    """A multi-turn conversation of a ShareGPT-style file."""

    system: str | None
    turns: tuple[tuple[str, str | None], ...]  # (human message, recorded reply)


def read_conversations(path: Path) -> list[Conversation]:
    """The multi-turn conversations of a ShareGPT-style file, every line checked."""
    where = f"--workload: sessions: {path}"
    found: list[Conversation] = []
    for item, item_where in json_items(read_text(path, where), where):
        if not isinstance(item, dict) or not isinstance(
            item.get("conversations"), list
        ):
            raise ConfigError(
                f"{item_where}: expected an object with 'conversations' (ShareGPT)"
            )
        system = item.get("system") if isinstance(item.get("system"), str) else None
        turns: list[tuple[str, str | None]] = []
        for i, turn in enumerate(item["conversations"]):
            if not (
                isinstance(turn, dict)
                and isinstance(turn.get("from"), str)
                and isinstance(turn.get("value"), str)
            ):
                raise ConfigError(
                    f"{item_where}: conversations[{i}] must be an object with "
                    "string 'from' and 'value'"
                )
            who, value = turn["from"].lower(), turn["value"]
            if who == "system" and not turns:
                system = value
            elif who in _HUMAN and value.strip():
                turns.append((value, None))
            elif who in _REPLY and turns and turns[-1][1] is None:
                turns[-1] = (turns[-1][0], value)
        if turns:
            found.append(Conversation(system, tuple(turns)))
    if not found:
        raise ConfigError(f"{where}: no conversation with a human turn in the file")
    return found


def _kind(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
