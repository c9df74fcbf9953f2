"""``sessions:``: multi-turn conversations, each turn sent with the whole history.

A session is one user's conversation: ``turns`` user messages, each sent after the
answer to the last one and a think time, with everything said before it (a shared
system prompt, the earlier user messages, the earlier answers) in front of it, so
the server's prefix cache can serve every turn's history. Spec keys (all optional)::

    sessions:turns=2:6,think=exp:2,system=0,user=64,output=128,answer=own
    sessions:users=8,...              # 8 concurrent users (a closed loop: sweep)
    sessions:file=PATH,...            # ShareGPT multi-turn conversations

``turns`` (``N`` or ``A:B``, uniform per session), ``user`` (tokens of a user
message, ``N`` or ``A:B`` per turn), ``first`` (tokens of the first one, by default
as ``user``: a long opening such as a pasted document) and ``output``
(``max_tokens`` per turn) draw from the seed; ``system`` is the tokens of one
system prompt all sessions share.
``think`` is the pause between an answer and the next message: ``S`` seconds, or
``exp:MEAN``, ``uniform:A:B``, ``lognormal:MEDIAN:SIGMA``. ``answer=own`` sends the
model's own answer back as the assistant turn (as a chat client does);
``answer=filler`` sends seeded words of the answer's token count instead, so the
history does not depend on what the model said; ``answer=file`` (with ``file=``)
sends the answers the file recorded. ``file=`` takes conversations from a
ShareGPT-style JSONL or JSON array (``conversations`` of ``from``/``value``): each
human message is a turn, the reply after it its budget (and its ``file`` answer);
``turns`` and ``user`` do not apply then.

How the load is set:

- open loop (``ramp``, ``capacity``): the arrival process starts sessions at the
  stage's rate, whatever the server does; within a session each turn waits for
  the last answer and the think time, as a person would. A turn's scheduled time
  is the last answer's end plus the think time, so its dispatch lag is the
  client's own lateness. A turn that would start after the schedule's end is not
  sent (the session is cut short, and counted).
- user-centric (``sweep``; ``users=N`` or ``--parallel N``): N users, each starting
  a new session as soon as its last one ends; a level ends after ``--number``
  turns. This is a closed loop: a slow server slows the users down, and the turns
  they did not send are not counted anywhere (coordinated omission, as with any
  closed loop); use it for "N people chatting", not for a rate.

A session ends early when a turn fails (a user whose request failed leaves). Each
turn is one request in ``requests.jsonl`` with ``session``, ``turn`` (from 1) and
``history_tokens`` (the tokens before its new user message: the last turn's prompt
plus answer as the server counted them, or as the workload counted them where the
server said nothing), and the summary groups the run ``by_turn``.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.promptfile import Conversation, read_conversations
from servemon.loadgen.workloads.prompts import OutputBudget, Prompt
from servemon.loadgen.workloads.specs import spec_int, spec_options, spec_range
from servemon.loadgen.workloads.tokens import (
    WORDS,
    TextFitter,
    TokenCounter,
    count_each,
)
from servemon.loadgen.workloads.wordpool import POOL_WORDS, pool_text

__all__ = [
    "Session",
    "SessionWorkload",
    "Think",
    "Turn",
    "build_sessions",
    "parse_sessions",
    "read_conversations",
    "system_messages",
]

Answer = Literal["own", "filler", "file"]
_KEYS = (
    "turns",
    "think",
    "system",
    "first",
    "user",
    "output",
    "answer",
    "users",
    "file",
)


@dataclass(frozen=True, slots=True)
class Think:
    """A think-time distribution, in seconds."""

    kind: Literal["const", "exp", "uniform", "lognormal"]
    a: float
    b: float = 0.0

    def draw(self, rng: random.Random) -> float:
        if self.kind == "const":
            return self.a
        if self.kind == "exp":
            return rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return rng.lognormvariate(math.log(self.a), self.b)

    def __str__(self) -> str:
        if self.kind == "const":
            return f"{self.a:g}"
        if self.kind == "exp":
            return f"exp:{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


def parse_think(text: str) -> Think:
    """``S``, ``exp:MEAN``, ``uniform:A:B`` or ``lognormal:MEDIAN:SIGMA``."""
    kind, _, rest = text.partition(":")
    try:
        if not rest:
            think = Think("const", float(kind))
        elif kind == "exp":
            think = Think("exp", float(rest))
        elif kind in ("uniform", "lognormal"):
            low, _, high = rest.partition(":")
            think = Think(kind, float(low), float(high))  # type: ignore[arg-type]
        else:
            raise ValueError(kind)
    except ValueError:
        think = Think("const", -1.0)
    ok = (
        all(math.isfinite(v) for v in (think.a, think.b))
        and think.a >= 0
        and (think.kind != "uniform" or think.b >= think.a)
        and (think.kind != "lognormal" or (think.a > 0 and think.b >= 0))
    )
    if not ok:
        raise ConfigError(
            f"--workload: sessions: think must be S, exp:MEAN, uniform:A:B or "
            f"lognormal:MEDIAN:SIGMA (seconds >= 0), got {text!r}"
        )
    return think


@dataclass(frozen=True, slots=True)
class Turn:
    """One user message of a session and what goes with it."""

    user: str
    #: Tokens of ``user`` under the workload's counter (None: not known exactly).
    user_tokens: int | None
    max_tokens: int
    #: Seconds between the last answer's end and this message (0 for turn 1).
    think_s: float
    #: The answer the file recorded (``answer=file``), or None.
    answer: str | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation: its system prompt and its turns."""

    index: int
    system: str | None
    system_tokens: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class SessionsSpec:
    """A parsed ``sessions:`` spec."""

    turns: OutputBudget
    think: Think
    system: int
    #: Tokens of the first user message (a pasted document, say); None: ``user``.
    first: OutputBudget | None
    user: OutputBudget
    output: OutputBudget | None
    answer: Answer
    users: int | None
    file: Path | None


@dataclass(frozen=True, slots=True)
class SessionWorkload:
    """Sessions built from a spec (see the module docstring). ``prompt(i)`` is the
    first turn of session ``i``, alone (what a single request of it would be)."""

    spec: str
    token_source: str
    seed: int
    options: SessionsSpec
    default_output: int
    pool: tuple[str, ...]  # one-token words, or WORDS under the estimate
    exact: bool
    system_text: str | None
    system_tokens: int
    conversations: tuple[Conversation, ...] = ()
    #: Tokens of each conversation's system prompt, and of its messages and
    #: replies (file= only).
    counts: tuple[tuple[int, tuple[tuple[int, int | None], ...]], ...] = ()

    @property
    def users(self) -> int | None:
        """``users=N``: the user-centric mode's number of users."""
        return self.options.users

    def prompt(self, index: int) -> Prompt:
        session = self.session(index)
        turn = session.turns[0]
        messages = (*system_messages(session), {"role": "user", "content": turn.user})
        tokens = None
        if turn.user_tokens is not None:
            tokens = turn.user_tokens + session.system_tokens
        return Prompt(None, messages, tokens, turn.max_tokens)

    def session(self, index: int) -> Session:
        """Session ``index``: the same for the same spec, seed and index."""
        o = self.options
        rng = random.Random(f"{self.seed}:session:{index}")
        if self.conversations:
            at = index % len(self.conversations)
            conversation = self.conversations[at]
            system_tokens, counted = self.counts[at]
            turns = []
            for k, ((text, reply), (tokens, reply_tokens)) in enumerate(
                zip(conversation.turns, counted, strict=True)
            ):
                budget = (
                    o.output.draw(self.seed, index * 1000 + k)
                    if o.output is not None
                    else reply_tokens or self.default_output
                )
                think = o.think.draw(rng) if k else 0.0
                turns.append(Turn(text, tokens, budget, think, reply))
            return Session(index, conversation.system, system_tokens, tuple(turns))
        count = o.turns.draw(self.seed, index)
        turns = []
        for k in range(count):
            lengths = o.first if k == 0 and o.first is not None else o.user
            tokens = lengths.draw(self.seed, index * 1000 + k)
            budget = (
                o.output.draw(self.seed, index * 1000 + k)
                if o.output is not None
                else self.default_output
            )
            text = self.words(f"user:{index}:{k}", tokens)
            think = o.think.draw(rng) if k else 0.0
            turns.append(Turn(text, tokens if self.exact else None, budget, think))
        return Session(index, self.system_text, self.system_tokens, tuple(turns))

    def words(self, key: str, tokens: int) -> str:
        """``tokens`` words of the pool from an offset seeded by ``key``."""
        return pool_text(self.pool, self.seed, key, tokens, exact=self.exact)


def system_messages(session: Session) -> tuple[dict[str, str], ...]:
    if not session.system:
        return ()
    return ({"role": "system", "content": session.system},)


# --- the spec ----------------------------------------------------------------


def parse_sessions(text: str, default_output: int) -> SessionsSpec:
    """The options of a ``sessions:`` spec (everything after the colon)."""
    options = spec_options("sessions", text, _KEYS)
    file = Path(options["file"]) if options.get("file") else None
    answer = options.get("answer", "own")
    if answer not in ("own", "filler", "file") or (answer == "file" and file is None):
        raise ConfigError(
            "--workload: sessions: answer must be own, filler or (with file=) file, "
            f"got {answer!r}"
        )
    if file is not None and ({"turns", "user", "first"} & set(options)):
        raise ConfigError(
            "--workload: sessions: turns=, first= and user= come from the file "
            "with file="
        )
    users = None
    if "users" in options:
        users = spec_range("sessions", "users", options["users"]).low
        if ":" in options["users"]:
            raise ConfigError("--workload: sessions: users must be one integer >= 1")
    output = (
        spec_range("sessions", "output", options["output"])
        if "output" in options
        else None
    )
    spec = SessionsSpec(
        turns=spec_range("sessions", "turns", options.get("turns", "2:6")),
        think=parse_think(options.get("think", "exp:2")),
        system=spec_int("sessions", "system", options.get("system", "0"), minimum=0),
        first=spec_range("sessions", "first", options["first"])
        if "first" in options
        else None,
        user=spec_range("sessions", "user", options.get("user", "64")),
        output=output,
        answer=answer,  # type: ignore[arg-type]
        users=users,
        file=file,
    )
    for key, longest in (
        ("system", spec.system),
        ("first", spec.first.high if spec.first else 0),
        ("user", spec.user.high),
    ):
        if longest >= POOL_WORDS:
            raise ConfigError(
                f"--workload: sessions: {key}={longest}: at most {POOL_WORDS - 1} "
                "tokens"
            )
    return spec


async def build_sessions(
    spec: str,
    counter: TokenCounter,
    seed: int,
    options: SessionsSpec,
    default_output: int,
) -> SessionWorkload:
    """Count what the sessions need: the one-token words, the system prompt, a
    file's messages."""
    fitter = await TextFitter.calibrate(counter)
    exact = bool(fitter.fillers) and counter.source != "estimate"
    pool = fitter.fillers if exact else WORDS
    workload = SessionWorkload(
        spec=spec,
        token_source=counter.source,
        seed=seed,
        options=options,
        default_output=default_output,
        pool=pool,
        exact=exact,
        system_text=None,
        system_tokens=0,
    )
    if options.system:
        text = workload.words("system", options.system)
        tokens = options.system if exact else await counter.count(text)
        workload = replace(workload, system_text=text, system_tokens=tokens)
    if exact:
        # The one-token words add up under this counter: check on a few messages.
        texts = [workload.words(f"check:{i}", 16 + i) for i in range(3)]
        if await count_each(counter, texts) != [16, 17, 18]:
            workload = replace(workload, pool=WORDS, exact=False)
    if options.file is not None:
        conversations = await asyncio.to_thread(read_conversations, options.file)
        counts = []
        for conversation in conversations:
            texts = [conversation.system or ""]
            texts += [
                t for turn in conversation.turns for t in (turn[0], turn[1] or "")
            ]
            numbers = await count_each(counter, texts)
            counted = tuple(
                (numbers[2 * k + 1], numbers[2 * k + 2] if turn[1] else None)
                for k, turn in enumerate(conversation.turns)
            )
            counts.append((numbers[0], counted))
        workload = replace(
            workload, conversations=tuple(conversations), counts=tuple(counts)
        )
    return workload
