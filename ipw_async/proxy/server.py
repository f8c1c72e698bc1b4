"""The recording proxy's HTTP side: an OpenAI- and Anthropic-compatible endpoint for any agent
framework.

Every ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` (OpenAI) and
``/v1/messages`` (Anthropic) is forwarded to the upstream server and its response streamed
back unchanged, while the call is kept as a record of the run, read as its API words it.
A call that carries ``x-ipw-task: NAME`` is a turn of task NAME; the task ends at
``POST /ipw/tasks/NAME/end`` (optionally with its answer and reference) or when the proxy
stops. ``GET /v1/models`` and ``/v1/models/ID`` are forwarded without being recorded; nothing
else is forwarded, so the proxy relays only what it measures. Given a token, every request must
carry it as a bearer header or as ``x-api-key`` (what OpenAI and Anthropic clients send their
API key as), and one that does not is answered 401 before anything is read,
forwarded or recorded.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web

from .._clock import NS, now_ns
from ..client import APIS, ClientConfig, fail
from ..errors import RunError
from ..harness.ledger import RunLedger
from ..records import ErrorType, RequestRecord, Status
from ..scoring import SCORERS, score
from ..telemetry.http import redact_url
from ..workload import Outcome, TaskLog
from .call import Call, read_call
from .relay import CallerGone, Relay

TASK_HEADER = "x-ipw-task"
RECORDED = {api.path.lstrip("/"): name for name, api in APIS.items()}  # under /v1, POST: its API
# a long agent history is a few MB; the bound is what keeps a caller from filling our memory
MAX_BODY = 32 * 1024 * 1024
MAX_TASK_NAME = 200  # characters
MAX_OPEN_TASKS = 10_000  # each open task holds its turns until it ends
SERVED = (
    f"{', '.join(f'POST /v1/{path}' for path in RECORDED)}, GET /v1/models, GET /v1/models/ID "
    "and POST /ipw/tasks/NAME/end"
)
_PATH_SAFE = ":@!$&'()*+,;="  # a path segment's characters (RFC 3986), as sent
_ANTHROPIC = frozenset({b"anthropic-version", b"x-api-key"})  # what only Anthropic's clients send


@dataclass
class _Task:
    log: TaskLog
    in_flight: int = 0


class RecordingProxy:
    """Serves on ``host:port`` while the run measures (a :class:`~ipw_async.harness.live.CallSource`);
    ``ready`` hears the proxy's base URL once it listens. With ``stream_usage``, a streamed call
    that does not say whether it wants usage asks the upstream for it (see :mod:`.call`). With a
    ``token`` every request must send ``Authorization: Bearer TOKEN`` or ``x-api-key: TOKEN``,
    which is never forwarded;
    without one it serves whoever reaches ``host:port`` (:func:`~ipw_async.proxy.run_proxy`
    refuses that beyond loopback unless told to)."""

    label = "proxy"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        ready: Callable[[str], None] | None = None,
        stream_usage: bool = True,
        token: str | None = None,
    ) -> None:
        self.host = host
        self.stream_usage = stream_usage
        self._token = token.encode() if token else None
        self.port = port
        self.ready = ready
        self.url: str | None = None
        self._tasks: dict[str, _Task] = {}
        self._task_ids = 0
        self._handlers: set[asyncio.Task[Any]] = set()
        self._socket: socket.socket | None = None

    def reserve(self) -> None:
        """The port, bound before the run measures, so a port in use stops it at once; nothing
        is accepted on it until the baseline is over (it does not listen yet)."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise RunError(
                f"the proxy cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); "
                "choose another --port"
            ) from None
        self._socket = sock

    def release(self) -> None:
        if self._socket is not None:
            self._socket.close()

    async def serve(
        self, ledger: RunLedger, upstream: ClientConfig, t0_ns: int, deadline_ns: int | None
    ) -> None:
        self.ledger, self.t0_ns = ledger, t0_ns
        self.relay = Relay(upstream, t0_ns, forward_authorization=self._token is None)
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._auth])
        app.router.add_post("/ipw/tasks/{task}/end", self._end_task)
        app.router.add_post(f"/v1/{{path:{'|'.join(RECORDED)}}}", self._forward)
        app.router.add_get("/v1/models", self._models, allow_head=False)
        app.router.add_get("/v1/models/{model:.+}", self._models, allow_head=False)
        app.router.add_route("*", "/{path:.*}", self._unserved)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        try:
            if self._socket is None:
                self.reserve()
            assert self._socket is not None
            port = self._socket.getsockname()[1]
            site = web.SockSite(runner, self._socket, backlog=4096)  # it listens from here on
            await site.start()
            host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
            self.url = f"http://{host}:{port}/v1"
            if self.ready is not None:
                self.ready(self.url)
            if deadline_ns is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(max(0.0, (deadline_ns - now_ns()) / NS))
        finally:
            await self._stop(runner)

    async def _stop(self, runner: web.AppRunner) -> None:
        """Calls in flight are cut and recorded as cancelled, and so are their tasks; the other
        open tasks end here as completed."""
        cut = {name for name, task in self._tasks.items() if task.in_flight}  # before the handlers unwind
        for handler in list(self._handlers):
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await runner.cleanup()
        for name in list(self._tasks):
            self._finish(name, Outcome.CANCELLED if name in cut else Outcome.COMPLETED)
        await self.relay.aclose()

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._token is not None and not self._authorized(request):
            return _error(
                401,
                "this proxy wants its token: send Authorization: Bearer TOKEN (an OpenAI "
                "client's api_key) or x-api-key: TOKEN (an Anthropic client's), TOKEN being "
                "the content of the proxy's --token-file",
                {"WWW-Authenticate": 'Bearer realm="ipw-async proxy"'},
            )
        return await handler(request)

    def _authorized(self, request: web.Request) -> bool:
        """The request carries the token, as a bearer token or as Anthropic's ``x-api-key``."""
        assert self._token is not None
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            given = request.headers.get("x-api-key", "")
        return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), self._token)

    async def _unserved(self, request: web.Request) -> web.Response:
        return _error(404, f"{request.method} {request.path[:100]} is not served here: this proxy serves {SERVED}")

    # a recorded call
    async def _forward(self, request: web.Request) -> web.StreamResponse:
        arrived = now_ns()
        task_name = request.headers.get(TASK_HEADER)
        if task_name and len(task_name) > MAX_TASK_NAME:
            return _error(
                400, f"the {TASK_HEADER} name is {len(task_name):,} characters long; at most {MAX_TASK_NAME}"
            )
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        # after the body is in, with no wait until the task is open: the bound holds exactly
        if task_name and task_name not in self._tasks and len(self._tasks) >= MAX_OPEN_TASKS:
            return _error(
                429,
                f"{MAX_OPEN_TASKS:,} tasks are open, the most this proxy keeps: end some "
                "(POST /ipw/tasks/NAME/end) before opening another",
            )
        path = request.match_info["path"]
        endpoint = RECORDED[path]
        headers = list(request.raw_headers)  # as they came: no decoding, any bytes
        call = read_call(body, self.stream_usage and APIS[endpoint].asks_usage)
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        record, task = self._record(task_name, arrived)
        self.ledger.started(None, record.request_id)
        try:
            return await self._relay(request, record, endpoint, headers, call)
        except asyncio.CancelledError:
            record.status, record.error_type = Status.CANCELLED, ErrorType.CANCELLED
            record.error_message = "the proxy stopped while this call was in flight"
            raise
        finally:
            self._handlers.discard(handler)
            if record.closed_ns is None:
                record.closed_ns = now_ns() - self.t0_ns
            # after the response: reading the body costs the caller nothing now
            record.prompt = call.prompt()
            if task is not None:
                task.in_flight -= 1
                if not task.log.prompt:
                    task.log.prompt = record.prompt
            await self.ledger.kept(record)

    async def _relay(
        self,
        request: web.Request,
        record: RequestRecord,
        endpoint: str,
        headers: list[tuple[bytes, bytes]],
        call: Call,
    ) -> web.StreamResponse:
        path = _with_query(request.match_info["path"], request)
        opened = await self.relay.open(record, request.method.encode(), path, headers, call.sent, endpoint)
        if opened is None:  # no answer from upstream: the caller gets the reason, as a server error
            error = {"error": {"message": record.error_message, "type": "upstream_unreachable"}}
            return web.json_response(error, status=502)
        head, exchange = opened
        if not head.streaming:
            data = await self.relay.body(record, exchange, endpoint)
            return web.Response(body=data, status=head.status, headers=head.headers)
        response = web.StreamResponse(status=head.status, headers=head.headers)
        await response.prepare(request)

        async def write(data: bytes) -> None:
            try:
                await response.write(data)
            except ConnectionError as exc:
                raise CallerGone from exc

        try:
            await self.relay.stream(record, exchange, write, hide_usage=call.asked_usage, endpoint=endpoint)
        except CallerGone:
            fail(
                record,
                ErrorType.CANCELLED,
                "the caller closed the connection before the response was through",
            )
            record.status = Status.CANCELLED
            return response
        except Exception:  # the upstream failed mid-stream: the caller sees the stream cut, as it was
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response

    def _record(self, task_name: str | None, arrived: int) -> tuple[RequestRecord, _Task | None]:
        request_id = self.ledger.number()
        task = None
        if task_name:
            task = self._tasks.get(task_name)
            if task is None:
                task = self._tasks[task_name] = _Task(self._new_log(task_name, arrived))
            task.in_flight += 1
        at = arrived - self.t0_ns
        record = RequestRecord(
            request_id=request_id,
            query_id=task_name or "proxy",
            dataset="proxy",
            prompt="",
            unit_id=request_id if task is None else task.log.task_id,
            task_id=None if task is None else task.log.task_id,
            turn_index=None if task is None else len(task.log.turns),
            scheduled_ns=at,
            dispatched_ns=at,
        )
        if task is not None:
            task.log.turn(record)
        return record, task

    def _new_log(self, name: str, arrived: int) -> TaskLog:
        self._task_ids += 1
        self.ledger.task_started()
        return TaskLog(self._task_ids, name, "proxy", False, "", None, arrived - self.t0_ns)

    def _finish(
        self, name: str, outcome: Outcome, answer: str | None = None, correct: bool | None = None
    ) -> None:
        task = self._tasks.pop(name)
        task.log.end(outcome, self.t0_ns, answer, correct)
        self.ledger.task_done(task.log)

    async def _end_task(self, request: web.Request) -> web.Response:
        """``POST /ipw/tasks/NAME/end`` with an optional JSON body ``{"answer", "reference",
        "scorer"}``: the task is over; with a reference its answer is scored."""
        name = request.match_info["task"]
        task = self._tasks.get(name)
        if task is None:
            return _error(
                404, f"no open task {name!r}: a task opens with its first call that sends {TASK_HEADER}"
            )
        try:
            given = await request.json() if request.can_read_body else {}
        except json.JSONDecodeError:
            return _error(400, "the body must be JSON: {answer, reference, scorer}")
        if not isinstance(given, dict):
            return _error(400, "the body must be a JSON object: {answer, reference, scorer}")
        answer, reference = given.get("answer"), given.get("reference")
        scorer = given.get("scorer", "contains")
        if scorer not in SCORERS:
            return _error(400, f"scorer must be one of {', '.join(SCORERS)}")
        answer = None if answer is None else str(answer)
        task.log.reference = None if reference is None else str(reference)
        correct = None if answer is None else score(answer, task.log.reference, scorer)
        turns = len(task.log.turns)
        self._finish(name, Outcome.ANSWERED if answer is not None else Outcome.COMPLETED, answer, correct)
        return web.json_response({"task": name, "turns": turns, "correct": correct})

    async def _models(self, request: web.Request) -> web.Response:
        """``GET /v1/models`` or ``/v1/models/ID``, forwarded and not recorded. An ID may hold
        slashes (``org/model``) but no dot segment, so the path cannot climb out of the
        upstream's ``/models``."""
        path = "models"
        if "model" in request.match_info:
            segments = request.match_info["model"].split("/")
            if any(s in ("", ".", "..") for s in segments):
                return await self._unserved(request)
            path += "/" + "/".join(quote(s, safe=_PATH_SAFE) for s in segments)
        headers = list(request.raw_headers)
        # no path tells the API here: an Anthropic client says it is one by its headers, and the
        # operator's key must go as that API reads it
        endpoint = "messages" if any(k.lower() in _ANTHROPIC for k, _ in headers) else "chat"
        answered = await self.relay.passthrough(b"GET", _with_query(path, request), headers, b"", endpoint)
        if answered is None:
            return _error(502, f"the upstream server at {redact_url(self.relay.base)} cannot be reached")
        status, kept, data = answered
        return web.Response(body=data, status=status, headers=kept)


async def _body(request: web.Request) -> bytes | web.Response:
    """The call's body, or the 413 that refuses one over :data:`MAX_BODY` (one that says its
    length is refused before any of it is read)."""
    if request.content_length is None or request.content_length <= MAX_BODY:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            pass
    return _error(413, f"the body is over the proxy's limit of {MAX_BODY // 2**20} MiB")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "ipw_proxy_error"}}, status=status, headers=headers
    )


def _with_query(path: str, request: web.Request) -> str:
    """The path forwarded with its query (``?api-version=…``), as the caller sent it."""
    return f"{path}?{request.query_string}" if request.query_string else path
