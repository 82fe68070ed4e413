"""The OpenAI-compatible HTTP front door: `POST /v1/chat/completions` becomes a request event, and
the answer on this door's own reply partition becomes the HTTP response.

    POST /v1/chat/completions   Authorization: Bearer <tenant API key>, Idempotency-Key: <key>
    GET  /healthz               200 once the broker client and the tenant registry are live
    GET  /metrics               Prometheus text (this process's registry)

The door authenticates the key against the tenant registry (config + `control`) before anything
is published: an unknown or revoked key is a 401 that costs the pipeline nothing. The key itself
never travels: the event carries the door's caller assertion, signed for this request only
(pipeline/security/caller_assertion.py), which mask verifies against the live registry (a key
revoked between door and mask is refused) and strips. The key is never logged. Pipeline-specific
request fields ride in an optional `llmpipe` object of the body (`extra_body={"llmpipe": {...}}` in the openai client): timeout_s,
context, device_id, device.

Streaming (`stream: true`): the text is sent as generate makes it (deltas, un-masked where the
tenant allows), one `chat.completion.chunk` per delta the moment it arrives, then the terminal
answer's finish; ingress/sse.py has the event order, ingress/stream_follow.py what the caller sees
when an attempt changes. An error before any text is an HTTP status; after it, an error event.
A caller who disconnects cancels the request. See docs/design.md, "Streaming and cancelling".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.responses import Response as HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from pydantic import ValidationError

from pipeline.config.settings import Settings
from pipeline.contracts import Feedback, RequestDoc, Response
from pipeline.contracts.request import ANONYMOUS_TENANT
from pipeline.ingress.client import Client, ClientTimeout, PublishError
from pipeline.ingress.openai_body import BodyError, ChatRequest, chat_request
from pipeline.ingress.openai_reply import completion, error_body, http_status, retry_after_s
from pipeline.ingress.shed import Shedder
from pipeline.ingress.sse import SseReply, stream_evidence
from pipeline.ingress.stream_follow import Ended, Piece
from pipeline.registries.metering import TenantMeter, feedback_cost, feedback_rate, prompt_size_refusal, request_rate
from pipeline.registries.tenants import Caller, TenantRegistry
from pipeline.runtime.broker.watch import BrokerWatch
from pipeline.runtime.codec import describe_validation_error
from pipeline.runtime.follow.follower import ControlFollower
from pipeline.runtime.serve.asgi import AsgiServer
from pipeline.runtime.topics import TopicNames
from pipeline.security.caller_assertion import sign as sign_assertion
from pipeline.security.sealing import Keyring, keyring_for
from pipeline.stores.owners import Owners, owner_refusal

log = logging.getLogger(__name__)

_REQUESTS = Counter("llmpipe_http_requests", "front-door chat completions, by HTTP status", ("status",))
_DUPLICATES = Gauge("llmpipe_http_duplicate_answers", "terminal answers for a request already answered (an "
                    "at-least-once redelivery): dropped, never shown to a caller")
_LATENCY = Histogram("llmpipe_http_seconds", "front-door chat completion latency (request to answer)",
                     buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
BROKER_RETRY_AFTER_S = 2  # the broker watch probes every second while it is down
GRACE_S = 2.0  # wait this long past the deadline: the pipeline's own deadline answer is better than ours
RECHECK_KEYS_EVERY_S = 1.0  # an unknown key re-reads `control` (a key just issued) at most this often
EPISODE_HEADER = "x-llmpipe-episode-id"  # or `llmpipe.episode_id` in the body
FEEDBACK_FIELDS = {"feedback_id", "request_id", "episode_id", "metric", "value"}  # what a caller may set


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class FrontDoor:
    """The door's lifecycle: start() opens the reply partition and follows `control`; stop() closes
    both. `app` is the ASGI application (uvicorn serves it; tests may drive it directly)."""

    def __init__(self, settings: Settings, bootstrap: str, owners: Owners | None = None) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.owners = owners  # who owns a request or episode (the warehouse); None: the feedback worker checks alone
        self.client = Client(bootstrap, topic_prefix=settings.topic_prefix, security=settings.kafka,
                             doorbell_dir=settings.doorbell_dir,
                             reply_partition=settings.http.reply_partition,
                             publish_timeout_s=settings.http.publish_timeout_s)
        self.broker: BrokerWatch | None = None  # started with the client: readiness and the fast 503
        # the stack's own word on readiness (None: ready; else why not), e.g. while it restarts its broker
        self.not_ready_because: Callable[[], str | None] = lambda: None
        self.registry = TenantRegistry(settings.tenants, settings.tenant_defaults)
        # this door's cheap pre-checks per tenant (registries/metering.py); admit holds the exact limits
        self.request_meter = TenantMeter(request_rate, "requests")
        self.feedback_meter = TenantMeter(feedback_rate, "feedback")
        self.shedder = Shedder(settings.http.max_queue_s)  # overload: refuse at once what would wait too long
        self._open = asyncio.Event()  # cleared while the stack rolls its broker (runtime/broker/roll.py)
        self._open.set()
        self.hold_max_s = 60.0  # a request held longer is answered 503 with a Retry-After
        self.follower: ControlFollower | None = None
        self.keyring: Keyring | None = None
        self._last_recheck = 0.0
        self._token_text: Callable[[int], str] | None = None
        self._tokenizer_lock = asyncio.Lock()  # concurrent first callers wait for one load
        self._tokenizer_tried = False
        self.ready = False
        self._background: set[asyncio.Future] = set()  # streams closed after their caller left
        self.warnings = config_warnings(settings)
        for w in self.warnings:
            log.warning("front door: %s", w)
        self.app = self._build_app()

    async def start(self) -> FrontDoor:
        # the key mask verifies our caller assertions with (and postprocess opens restore mappings with)
        self.keyring = await asyncio.to_thread(keyring_for, self.settings)
        self.client.delta_keyring = self.keyring  # opens the deltas generate sealed for our callers
        await self.client.start()
        assert self.client.producer is not None
        _DUPLICATES.set_function(lambda: self.client.duplicates)
        self.broker = await BrokerWatch(self.client.producer.client, [self.client.entry_topic, self.client.names.responses],
                                        process="frontdoor").start()
        topic = TopicNames(self.settings.topic_prefix)("control")
        self.follower = await ControlFollower(self.bootstrap, topic, self.registry.apply, self.settings.kafka,
                                              self.settings.doorbell_dir).start()
        self.ready = True
        return self

    # ---- broker roll (runtime/broker/roll.py steps 2 and 6) --------------------------------------

    def hold(self) -> None:
        """New requests wait at the door instead of being published."""
        self._open.clear()

    async def release(self, within_s: float = 5.0) -> None:
        """Let held requests through, once this door's own watch sees the broker again."""
        deadline = time.monotonic() + within_s
        while self.broker is not None and not self.broker.up and time.monotonic() < deadline:  # noqa: ASYNC110 - the watch has no event
            await asyncio.sleep(0.05)
        self._open.set()

    def in_flight(self) -> int:
        return self.shedder.in_flight

    async def _through_hold(self) -> None:
        if self._open.is_set():
            return
        try:
            async with asyncio.timeout(self.hold_max_s):
                await self._open.wait()
        except TimeoutError:
            raise HttpError(503, "broker_rolling", "the stack is rolling its embedded broker; retry shortly",
                            {"Retry-After": "5"}) from None

    async def stop(self) -> None:
        self.ready = False
        if self.broker is not None:
            await self.broker.stop()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.follower is not None:
            await self.follower.stop()
        await self.client.stop()

    # ---- pieces of one request ------------------------------------------------------------------

    async def _caller(self, authorization: str | None) -> tuple[str | None, Caller | None]:
        key = None
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise HttpError(401, "unauthenticated", "use `Authorization: Bearer <API key>`")
            key = value.strip()
        if key is None:
            if self.settings.auth.required:
                raise HttpError(401, "unauthenticated", "an API key is required")
            return None, None
        caller = self.registry.authenticate(key)
        if caller is None and self.follower is not None and self.registry.why_refused(key) == "unknown_key" \
                and time.monotonic() - self._last_recheck > RECHECK_KEYS_EVERY_S:
            self._last_recheck = time.monotonic()  # a key issued a moment ago may still be on its way
            await self.follower.catch_up(10)
            caller = self.registry.authenticate(key)
        if caller is None:  # the caller is not told whether the key is unknown or revoked
            raise HttpError(401, "unauthenticated", "unknown or revoked API key")
        return key, caller

    async def _body(self, request: Request) -> dict[str, Any]:
        limit = self.settings.http.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise HttpError(413, "body_too_large", f"the body is larger than {limit} bytes")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise HttpError(413, "body_too_large", f"the body is larger than {limit} bytes")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise HttpError(422, "invalid_request", "the body is not JSON") from None
        if not isinstance(body, dict):
            raise HttpError(422, "invalid_request", "the body must be a JSON object")
        return body

    async def token_text(self) -> Callable[[int], str]:
        """Spell a token id: the served model's tokenizer, or `<id>` when it cannot be loaded here."""
        async with self._tokenizer_lock:
            if self._token_text is None and not self._tokenizer_tried:
                await self._load_tokenizer()
        return self._token_text or (lambda tid: f"<{tid}>")

    async def _load_tokenizer(self) -> None:
        self._tokenizer_tried = True
        if self.settings.http.tokenizer:
            try:
                from pipeline.engines.tokenizer import load_chat_tokenizer

                tok = await asyncio.to_thread(load_chat_tokenizer, self.settings)
                self._token_text = lambda tid: tok.decode([tid])
            except Exception as exc:  # noqa: BLE001 - logprobs still work, spelled as ids
                log.warning("front door: no tokenizer for logprob tokens (%s); showing ids", type(exc).__name__)

    async def chat_completions(self, request: Request) -> HttpResponse:
        t0 = time.perf_counter()
        request_id = uuid.uuid4().hex
        try:
            doc, parsed, timeout_s = await self._request(request, request_id)
            now = time.monotonic()
            if (shed := self.shedder.check(now, (doc.deadline_ms or 0) / 1000 - time.time())) is not None:
                raise HttpError(503, "overloaded", shed.reason, {"Retry-After": str(shed.retry_after_s)})
            self.shedder.started()
            answered = False
            try:
                if parsed.stream:
                    streamed = await self._stream(doc, parsed, timeout_s, t0)
                    answered = True
                    return streamed
                resp = await self._wait(doc, timeout_s)
                answered = True
            except PublishError as exc:
                if self.broker is not None:
                    self.broker.failed(str(exc))
                raise _broker_unavailable() from None
            finally:
                self.shedder.finished(time.monotonic(), answered)
        except HttpError as exc:
            _LATENCY.observe(time.perf_counter() - t0)
            return self._http_error(exc, request_id)
        _LATENCY.observe(time.perf_counter() - t0)
        if (status := http_status(resp)) != 200:
            return self._error_answer(resp, status)
        _REQUESTS.labels("200").inc()
        token_text = await self.token_text() if parsed.body.logprobs else None
        return HttpResponse(orjson.dumps(completion(resp, parsed.body.model, token_text)),
                            media_type="application/json", headers=_answer_headers(resp))

    async def models(self, request: Request) -> JSONResponse:
        """`GET /v1/models`: the configured routes and the deployments, each with what it can do (any
        authenticated caller's view; a tenant's own restrictions apply when it sends a request)."""
        try:
            await self._caller(request.headers.get("authorization"))
        except HttpError as exc:
            return self._http_error(exc, uuid.uuid4().hex)
        # the routes an operator configured (the door never imports a stage: the route policy's own
        # defaults are not listed), then every deployment with its capabilities
        spec = next((st for st in self.settings.stages if st.name == "route"), None)
        routes = (spec.policy or {}).get("routes") if spec is not None else None
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "llmpipe",
                 "llmpipe": {"kind": "route", "model": r.get("model"), "deployments": r.get("deployments", [])}}
                for name, r in (routes or {}).items() if isinstance(r, dict)]
        data += [{"id": d.name, "object": "model", "created": 0, "owned_by": "llmpipe",
                  "llmpipe": {"kind": "deployment", "model": d.model, "engine": d.engine, "max_context": d.max_context,
                              "images": d.images, "json_schema": d.json_schema, "tools": d.serves_tools,
                              "region": d.region}}
                 for d in self.settings.deployments]
        return JSONResponse({"object": "list", "data": data})

    async def feedback(self, request: Request) -> JSONResponse:
        """`POST /v1/feedback`: {request_id | episode_id, metric, value, feedback_id?}. Checked here as
        far as the door can (the caller, the metric, the owner), then published with the door's signed
        word for the caller; the feedback worker checks again, masks text and passes it on."""
        fb_id = ""
        try:
            if not self.ready:
                raise HttpError(503, "not_ready", "the front door is starting or stopping")
            await self._through_hold()
            _, caller = await self._caller(request.headers.get("authorization"))
            body = await self._body(request)
            if unknown := sorted(set(body) - FEEDBACK_FIELDS):
                raise HttpError(422, "invalid_request", f"unknown field(s) {unknown}; expected {sorted(FEEDBACK_FIELDS)}")
            try:
                fb = Feedback.model_validate(body)
            except ValidationError as exc:
                raise HttpError(422, "invalid_request", describe_validation_error(exc)) from None
            fb_id = fb.feedback_id
            refused = self.settings.feedback.refusal(fb)
            if refused is None:  # counted before the owner lookup and the masking it would cost
                self._meter(self.feedback_meter, caller, fb.created_ms, feedback_cost(fb.value))
            if refused is None and self.owners is not None:
                kind, target = fb.target
                refused = owner_refusal(await self.owners.check(caller.tenant if caller else ANONYMOUS_TENANT, kind,
                                                                target), kind)
            if refused is not None:
                raise HttpError(refused.status, refused.error_class, refused.reason)
            if caller is not None:
                assert self.keyring is not None
                fb = fb.model_copy(update={"caller_assertion": sign_assertion(fb, caller, self.keyring)})
            if (self.broker is not None and not self.broker.up) or self.not_ready_because() is not None:
                raise _broker_unavailable()
            try:
                await self.client.send_feedback(fb)
            except PublishError as exc:
                if self.broker is not None:
                    self.broker.failed(str(exc))
                raise _broker_unavailable() from None
        except HttpError as exc:
            return self._http_error(exc, fb_id)
        _REQUESTS.labels("200").inc()
        return JSONResponse({"feedback_id": fb.feedback_id})

    def _http_error(self, exc: HttpError, request_id: str) -> JSONResponse:
        _REQUESTS.labels(str(exc.status)).inc()
        return JSONResponse(error_body(exc.status, exc.message, exc.code, request_id), exc.status,
                            headers={"x-request-id": request_id, "x-answered-by": "frontdoor", **exc.headers})

    def _error_answer(self, resp: Response, status: int) -> JSONResponse:
        _REQUESTS.labels(str(status)).inc()
        headers = _answer_headers(resp)
        if status == 429 or (status == 503 and resp.retry_after_ms is not None):
            headers["retry-after"] = str(retry_after_s(resp))
        message = resp.reason or resp.error_class or resp.status.value
        return JSONResponse(error_body(status, message, resp.error_class or resp.status.value, resp.request_id),
                            status, headers=headers)

    async def _request(self, request: Request, request_id: str) -> tuple[RequestDoc, ChatRequest, float]:
        """Authenticate, read and check the body: the request event, not yet published."""
        if not self.ready:
            raise HttpError(503, "not_ready", "the front door is starting or stopping")
        await self._through_hold()  # before the broker check: a rolling broker is briefly down
        if (self.broker is not None and not self.broker.up) or self.not_ready_because() is not None:
            raise _broker_unavailable()  # nothing is published that could not be answered
        _, caller = await self._caller(request.headers.get("authorization"))
        body = await self._body(request)
        try:
            parsed = chat_request(body)
        except BodyError as exc:
            raise HttpError(422, "invalid_request", str(exc)) from None
        except ValidationError as exc:
            raise HttpError(422, "invalid_request", describe_validation_error(exc)) from None
        http = self.settings.http
        timeout_s = min(parsed.timeout_s or http.request_timeout_s, http.max_timeout_s)
        ext = parsed.extension
        try:
            doc: RequestDoc = self.client.build(
                body=parsed.body, request_id=request_id, timeout_s=timeout_s,
                tenant_id=caller.tenant if caller else None,
                idempotency_key=request.headers.get("idempotency-key") or None,
                traceparent=request.headers.get("traceparent") or None,
                **({"context": ext.context} if ext and ext.context else {}),
                device_id=ext.device_id if ext else None, device=ext.device if ext else None,
                episode_id=(ext.episode_id if ext else None) or request.headers.get(EPISODE_HEADER) or None)
        except ValidationError as exc:
            raise HttpError(422, "invalid_request", describe_validation_error(exc)) from None
        limits = self.registry.limits_for(caller.tenant if caller else ANONYMOUS_TENANT)
        if refused := limits.tools.refused([t.function.name for t in doc.body.tools], caller.roles if caller else ()):
            raise HttpError(403, "tool_not_allowed", f"this API key may not offer the tool(s) {', '.join(refused[:5])}")
        if (too_big := prompt_size_refusal(doc.body.messages, limits)) is not None:
            raise HttpError(413, "too_large", too_big)  # mask checks again, for the Kafka path
        self._meter(self.request_meter, caller, doc.created_ms)
        if parsed.stream and doc.reply_to is not None:  # final before signing: the assertion covers reply_to
            doc = doc.model_copy(update={"reply_to": doc.reply_to.model_copy(update={"stream": True})})
        if caller is not None:  # the key stays here: the request carries the door's signed word instead
            assert self.keyring is not None
            doc = doc.model_copy(update={"caller_assertion": sign_assertion(doc, caller, self.keyring)})
        return doc, parsed, timeout_s

    def _meter(self, meter: TenantMeter, caller: Caller | None, created_ms: int, cost: float = 1.0) -> None:
        """429 when the caller's tenant is over its rate at this door, before anything is published."""
        tenant = caller.tenant if caller else ANONYMOUS_TENANT
        over = meter.check(tenant, self.registry.limits_for(tenant), created_ms, cost)
        if over is not None:
            raise HttpError(429, "rate_limited", over.reason, {"Retry-After": over.retry_after_header})

    @staticmethod
    def _wait_s(doc: RequestDoc) -> float:
        return max(0.0, (doc.deadline_ms or 0) / 1000 - time.time()) + GRACE_S

    async def _wait(self, doc: RequestDoc, timeout_s: float) -> Response:
        fut = await self.client.submit(doc)
        try:
            return await self.client.wait(doc.request_id, fut, self._wait_s(doc))
        except ClientTimeout:
            raise _no_answer(timeout_s) from None

    async def _stream(self, doc: RequestDoc, parsed: ChatRequest, timeout_s: float, t0: float) -> HttpResponse:
        """`stream: true`: the first event decides the HTTP status. A terminal error before any text
        is an HTTP error, as without streaming; otherwise a 200 event stream follows the events as
        they come (SseReply), and a caller who leaves cancels the request."""
        events = self.client.stream(doc, self._wait_s(doc), cancel_reason="disconnected")
        try:
            first = await anext(events)
        except ClientTimeout:
            await events.aclose()
            raise _no_answer(timeout_s) from None
        except BaseException:
            await events.aclose()
            raise
        if isinstance(first, Ended) and (status := http_status(first.response)) != 200:
            await events.aclose()
            _LATENCY.observe(time.perf_counter() - t0)
            return self._error_answer(first.response, status)
        _REQUESTS.labels("200").inc()
        token_text = await self.token_text() if parsed.body.logprobs else None
        reply = SseReply(doc.request_id, parsed.body.model, parsed.include_usage, token_text, t0)
        return StreamingResponse(self._sse(doc, reply, first, events), media_type="text/event-stream",
                                 headers={"x-request-id": doc.request_id, "cache-control": "no-cache"})

    async def _sse(self, doc: RequestDoc, reply: SseReply, first: Piece | Ended,
                   events: AsyncIterator[Piece | Ended]) -> AsyncIterator[bytes]:
        """Each event as it comes, then the timing evidence. A caller who disconnects cancels this
        generator (Starlette); the request is then cancelled from a task of its own, since any
        await here would be cancelled again."""
        try:
            # one write per event: small writes in a row wait on the peer's delayed ACK (Nagle)
            yield b"".join(reply.on(first))
            while not reply.ended:
                try:
                    event = await anext(events)
                except ClientTimeout:
                    yield reply.error(504, "no_answer_in_time", "no answer before the deadline")
                    break
                yield b"".join(reply.on(event))
        finally:
            # closing the stream cancels the request unless it ended (Client.stream); a caller who left
            # cancelled this generator, so the close runs as a task of its own
            closing = asyncio.ensure_future(events.aclose())
            self._background.add(closing)
            closing.add_done_callback(self._background.discard)
            _LATENCY.observe(time.perf_counter() - reply.t0)
            self._record_stream(doc, reply)

    def _record_stream(self, doc: RequestDoc, reply: SseReply) -> None:
        """The caller-side timing of a streamed answer, as an evidence row next to the stages' (it is
        known only here, after the terminal answer was written)."""
        ev = stream_evidence(doc, reply)
        if ev is not None:
            self.client.publish_soon(TopicNames(self.settings.topic_prefix).evidence, ev, doc.request_id)

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="llmpipe", docs_url=None, redoc_url=None, openapi_url=None)
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])
        app.add_api_route("/v1/feedback", self.feedback, methods=["POST"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])

        async def healthz() -> JSONResponse:
            """Liveness: the door runs (a broker outage is not a reason to restart it; see /readyz)."""
            ok = self.ready
            body: dict[str, Any] = {"status": "ok" if ok else "starting", "auth_required": self.settings.auth.required,
                                    "broker": self.broker.state() if self.broker is not None else {"state": "unknown"}}
            if self.warnings:
                body["warnings"] = self.warnings
            return JSONResponse(body, 200 if ok else 503)

        async def readyz() -> JSONResponse:
            """Readiness: requests can be taken now (the door started and reaches the broker)."""
            broker = self.broker.state() if self.broker is not None else {"state": "unknown"}
            why = "starting or stopping" if not self.ready else \
                f"broker {broker['state']}: {broker.get('reason', '')}" if broker["state"] != "up" else \
                self.not_ready_because()
            body: dict[str, Any] = {"ready": why is None, "broker": broker}
            if why is not None:
                body["reason"] = why
            return JSONResponse(body, 200 if why is None else 503)

        async def metrics() -> HttpResponse:
            return HttpResponse(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

        app.add_api_route("/healthz", healthz, methods=["GET"])
        app.add_api_route("/readyz", readyz, methods=["GET"])
        app.add_api_route("/metrics", metrics, methods=["GET"])
        return app


def config_warnings(settings: Settings) -> list[str]:
    """Settings an operator must not miss: each weakens a default that protects the service."""
    out = []
    if not settings.auth.required:
        out.append("auth.required is false: requests without an API key run as tenant `anonymous`")
    for spec in settings.stages:
        allow = ((spec.policy.get("rules") or {}).get("test_allow") or []) if spec.name == "media" else []
        if allow:
            out.append(f"media rules.test_allow exempts {len(allow)} endpoint(s) from the SSRF address rules "
                       "(a test setting)")
    return out


def _answer_headers(resp: Response) -> dict[str, str]:
    return {"x-request-id": resp.request_id, "x-answered-by": resp.answered_by}


def _broker_unavailable() -> HttpError:
    return HttpError(503, "broker_unavailable", "the event broker is unreachable; the request was not accepted, "
                     "retry later (with an Idempotency-Key a retry never runs a request twice)",
                     {"Retry-After": str(BROKER_RETRY_AFTER_S)})


def _no_answer(timeout_s: float) -> HttpError:
    # published: it will be answered and recorded later
    return HttpError(504, "no_answer_in_time", f"no answer within {timeout_s:.0f}s", {"x-answered-by": "pending"})


class HttpServer:
    """Serve a FrontDoor on host:port (0 = a free port); `url` is known once constructed."""

    def __init__(self, door: FrontDoor, host: str, port: int) -> None:
        self.door = door
        self.asgi = AsgiServer(door.app, host, port)
        self.url = self.asgi.url

    async def start(self) -> HttpServer:
        await self.door.start()
        await self.asgi.start()
        log.info("front door on %s", self.url)
        return self

    async def stop(self) -> None:
        await self.asgi.stop()
        await self.door.stop()
