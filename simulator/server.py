"""The simulator's HTTP face: vLLM's OpenAI-compatible API, ``/metrics`` and faults.

:class:`SimServer` owns the engine's step task and an aiohttp runner. It is an async
context manager; ``await server.start()`` binds (port 0 picks a free port) and
returns the base URL. A client that disconnects mid-request cancels its handler
(aiohttp's ``handler_cancellation``), which aborts the request in the engine and frees
its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import random
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from servemon.core.errors import ConfigError
from servemon.simulator.answer import (
    RoleChunk,
    stream_answer,
    trace_record,
    whole_answer,
)
from servemon.simulator.chunks import ChunkWriter
from servemon.simulator.config import SimConfig, merge
from servemon.simulator.engine import Engine, EngineArgs
from servemon.simulator.metrics import EngineMetrics
from servemon.simulator.openai import ApiError, ParsedRequest, error_body, parse_request
from servemon.simulator.profiles import Profile, load_profile
from servemon.simulator.trace import TraceWriter

__all__ = ["SimServer", "is_loopback_peer"]

VERSIONS = {
    "vllm": "0.11.0",
    "vllm-0.25": "0.25.1",
    "vllm-0.34": "0.34.0",
    "vllm-0.10": "0.10.2",
    "vllm-0.8": "0.8.5",
    "vllm-v0": "0.6.3",
    "sglang": "0.5.0",
    "llamacpp": "b11434",
}
RUNTIME_FIELDS = ("faults", "speed", "eos_probability")


def is_loopback_peer(remote: str | None) -> bool:
    """Whether a request's peer address is this machine's loopback: 127.0.0.0/8,
    ``::1``, or 127.x written as IPv4-mapped IPv6 (``::ffff:127.0.0.1``, a peer of
    a dual-stack ``::`` socket). Anything else, or no address (a Unix socket, a
    closed transport), is not."""
    if not remote:
        return False
    try:
        address = ipaddress.ip_address(remote.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class SimServer:
    """A simulated vLLM endpoint bound to ``config.host:config.port``."""

    def __init__(self, config: SimConfig, profile: Profile | None = None) -> None:
        self.config = config
        self.profile = profile or load_profile(config.profile)
        p = self.profile
        self.engine = Engine(
            p,
            EngineArgs(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                num_gpu_blocks=config.num_gpu_blocks or p.num_gpu_blocks,
                block_size=config.block_size or p.block_size,
                max_model_len=config.max_model_len or p.max_model_len,
                enable_prefix_caching=config.enable_prefix_caching,
                eos_probability=p.eos_probability
                if config.eos_probability is None
                else config.eos_probability,
                seed=config.seed,
                lora_modules=config.lora_modules,
                max_loras=config.max_loras,
                max_cpu_loras=config.max_cpu_loras or config.max_loras,
                lora_load_s=config.lora_load_s,
                reasoning_tokens=config.reasoning_tokens,
                max_num_queued_reqs=config.max_num_queued_reqs,
                max_num_queued_tokens=config.max_num_queued_tokens,
                enable_mfu_metrics=config.enable_mfu_metrics,
            ),
        )
        self.engine.speed = config.speed
        #: The names the model answers to; the first is its name in responses and
        #: metrics (vLLM's ``--served-model-name``).
        self.names: tuple[str, ...] = config.served_model_name or (p.model,)
        self.model = self.names[0]
        self.faults = config.faults
        self.registry = CollectorRegistry(auto_describe=True)
        self.dialect = config.dialect
        metrics_dialect = (
            "llamacpp" if config.dialect == "llamacpp" else config.metrics_dialect
        )
        self.registry.register(EngineMetrics(self.engine, self.model, metrics_dialect))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._rng = random.Random(f"faults:{config.seed}")
        self._trace = TraceWriter(Path(config.trace)) if config.trace else None
        self._runner: web.AppRunner | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[object]] = set()
        self.url = ""

    # -- lifecycle --------------------------------------------------------------

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/sim/config", self._get_config)
        app.router.add_put("/sim/config", self._put_config)
        return app

    async def start(self) -> str:
        """Start the engine and bind; return the base URL (``http://host:port``)."""
        self._engine_task = asyncio.create_task(self.engine.run(), name="sim-engine")
        self._runner = web.AppRunner(
            self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = (
            f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
        )
        return self.url

    async def stop(self) -> None:
        """Stop serving and the engine; close the trace."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._engine_task is not None:
            self._engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task
            self._engine_task = None
        if self._trace is not None:
            self._trace.close()
            self._trace = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- small endpoints ----------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        """Every served name (``root``: the model they all name), then every
        adapter (``parent``: the first name), as vLLM's serving_models lists them."""
        created = int(time.time())

        def card(name: str, root: str, parent: str | None) -> dict[str, object]:
            return {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": parent,
                "max_model_len": None if parent else self.engine.args.max_model_len,
            }

        cards = [card(name, self.profile.model, None) for name in self.names]
        cards += [card(name, name, self.model) for name in self.config.lora_modules]
        return web.json_response({"object": "list", "data": cards})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        if self.dialect != "vllm":
            return self._not_found()
        return web.json_response({"version": VERSIONS[self.config.metrics_dialect]})

    def _not_found(self) -> web.Response:
        """What a server without the endpoint answers (FastAPI's, or a plain 404)."""
        if self.dialect == "transformers":
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.Response(status=404, text="File Not Found")

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.dialect == "transformers":
            return self._not_found()
        mode = self.faults.metrics
        if mode == "503":
            return web.Response(status=503, text="Service Unavailable")
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "garbage":
            return web.Response(
                text="<html>502 Bad Gateway</html>\nvllm:num_requests_running{{{ 1\n",
                content_type="text/plain",
            )
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _tokenize(self, request: web.Request) -> web.Response:
        if self.dialect == "transformers":
            return self._not_found()
        body = await self._json(request)
        if self.dialect == "llamacpp":
            content = body.get("content") if isinstance(body, dict) else None
            if not isinstance(content, str):
                return self._error(400, '"content" must be provided')
            return web.json_response({"tokens": self.engine.tokenizer.encode(content)})
        api: Literal["chat", "completions"] = (
            "chat" if isinstance(body, dict) and "messages" in body else "completions"
        )
        try:
            parsed = parse_request(api, body, self.engine.tokenizer)
        except ApiError as exc:
            return web.json_response(exc.body(self.dialect), status=exc.status)
        return web.json_response(
            {
                "count": len(parsed.prompt),
                "max_model_len": self.engine.args.max_model_len,
                "tokens": parsed.prompt,
            }
        )

    def _runtime_config(self) -> dict[str, object]:
        return {
            "faults": dataclasses.asdict(self.faults),
            "speed": self.engine.speed,
            "eos_probability": self.engine.eos_probability,
        }

    async def _get_config(self, request: web.Request) -> web.Response:
        if not is_loopback_peer(request.remote):
            return self._error(403, "/sim/config answers only on loopback", "Forbidden")
        return web.json_response(self._runtime_config())

    async def _put_config(self, request: web.Request) -> web.Response:
        if not is_loopback_peer(request.remote):
            return self._error(403, "/sim/config answers only on loopback", "Forbidden")
        body = await self._json(request)
        if not isinstance(body, dict):
            return self._error(400, "PUT /sim/config: expected a JSON object")
        unknown = sorted(set(body) - set(RUNTIME_FIELDS))
        if unknown:
            allowed = ", ".join(RUNTIME_FIELDS)
            return self._error(
                400,
                f"PUT /sim/config: {unknown[0]}: not changeable at run time "
                f"(changeable: {allowed})",
            )
        current = dataclasses.replace(
            self.config,
            faults=self.faults,
            speed=self.engine.speed,
            eos_probability=self.engine.eos_probability,
        )
        try:
            updated = merge(current, body, "PUT /sim/config", skip_none=False)
        except ConfigError as exc:
            return self._error(400, str(exc))
        self.faults = updated.faults
        self.engine.speed = updated.speed
        if updated.eos_probability is not None:
            self.engine.eos_probability = updated.eos_probability
        return web.json_response(self._runtime_config())

    # -- completions ------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completions")

    async def _complete(
        self, request: web.Request, api: Literal["chat", "completions"]
    ) -> web.StreamResponse:
        arrival = time.monotonic()
        body = await self._json(request)
        try:
            parsed = parse_request(api, body, self.engine.tokenizer)
            lora = self._resolve(parsed.model)
            max_tokens = self._check(parsed)
        except ApiError as exc:
            return web.json_response(exc.body(self.dialect), status=exc.status)
        limit = self.engine.admission_rejection(len(parsed.prompt))
        if limit is not None:
            return self._error(
                503,
                f"The server is at its admission limit ({limit}); retry later.",
                "ServiceUnavailableError",
            )
        faults = self.faults
        draw = self._rng.random()
        if draw < faults.http_500_fraction:
            return self._error(
                500, "Simulated internal server error", "InternalServerError"
            )
        if draw < faults.http_500_fraction + faults.http_503_fraction:
            return self._error(503, "Simulated overload", "ServiceUnavailableError")
        cut = self._rng.random() < faults.cut_stream_fraction
        malformed = self._rng.random() < faults.malformed_sse_fraction
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        prefix = "chatcmpl-" if api == "chat" else "cmpl-"
        writer = ChunkWriter(
            api,
            prefix + request_id,
            lora or self.model,  # vLLM answers with the first name, or the adapter
            dialect=self.dialect,
            details=self.config.enable_prompt_tokens_details,
            metrics=self.config.enable_per_request_metrics,
            reasoning_field=self.config.reasoning_field,
            reasoning_usage=self.config.reasoning_usage,
        )
        if faults.slow_headers_s > 0:
            await asyncio.sleep(faults.slow_headers_s)
        response: web.StreamResponse | None = None
        if parsed.stream:
            headers = {"Content-Type": "text/event-stream", "X-Request-Id": request_id}
            if self.dialect == "llamacpp":
                # Advertised, though the connection is closed after the stream.
                headers["Keep-Alive"] = "timeout=5, max=100"
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
        role = RoleChunk(
            response if api == "chat" and faults.role_chunk else None,
            writer.role(),
            faults.role_chunk_delay_s,
        )
        await role.start()
        if faults.first_token_stall_s > 0:
            await asyncio.sleep(faults.first_token_stall_s)
        if self.profile.frontend_latency_s > 0:
            await asyncio.sleep(self.profile.frontend_latency_s / self.engine.speed)
        req = self.engine.add_request(
            request_id,
            parsed.prompt,
            max_tokens=max_tokens,
            min_tokens=parsed.min_tokens,
            ignore_eos=parsed.ignore_eos,
            arrival_s=arrival,
            lora=lora,
        )
        written: list[float] = []
        status = 200
        try:
            if response is None:
                return await whole_answer(req, writer, written)
            await stream_answer(
                self.engine,
                req,
                parsed,
                writer,
                response,
                written,
                role,
                cut,
                malformed,
            )
            return response
        except asyncio.CancelledError:
            self.engine.abort(req)
            status = 499
            raise
        except ConnectionError:
            # The client went away while we wrote: abort quietly, as vLLM does.
            self.engine.abort(req)
            status = 499
            if response is None:
                raise
            return response
        finally:
            role.cancel()
            if self._trace is not None:
                self._trace.write(trace_record(req, written, status))

    def _resolve(self, model: str | None) -> str | None:
        """The LoRA adapter ``model`` names, ``None`` for the base model (no model,
        or a served name); vLLM's 404 for anything else."""
        if not model or model in self.names:
            return None
        if model in self.config.lora_modules:
            return model
        raise ApiError(
            404,
            f"The model `{model}` does not exist.",
            kind="NotFoundError",
            param="model",
        )

    def _check(self, parsed: ParsedRequest) -> int:
        limit = self.engine.args.max_model_len
        max_tokens = parsed.max_tokens
        if max_tokens is None:
            max_tokens = max(1, limit - len(parsed.prompt))
        problem = self.engine.capacity_error(len(parsed.prompt), max_tokens)
        if problem:
            raise ApiError(400, problem, param="max_tokens")
        return max_tokens

    # -- helpers ------------------------------------------------------------------

    async def _json(self, request: web.Request) -> object:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    def _error(
        self, status: int, message: str, kind: str = "BadRequestError"
    ) -> web.Response:
        body = error_body(status, message, kind, dialect=self.dialect)
        return web.json_response(body, status=status)
