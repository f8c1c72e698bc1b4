"""The transport under the client: keep-alive, TLS, proxies from the environment, httpx over
it, and each way a connection fails. Real sockets on loopback where a server is needed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trustme

from ipw_async.client import ClientConfig, StreamingClient, list_models
from ipw_async.records import ErrorType, RequestRecord, Status
from ipw_async.sim import SimulatorProcess
from ipw_async.transport import ConnectionPool, PoolTransport, route_for
from ipw_async.transport._connection import Arrivals, Connection, Exchange
from ipw_async.transport.scripted import MS, ManualClock, Reply, ScriptedNetwork
from ipw_async.workload.body import BodyDefaults, prompt_fields

from .conftest import scripted_send

EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}'
STREAM = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"%x\r\n%s\n\n\r\n0\r\n\r\n" % (len(EVENT) + 2, EVENT)
)


def record(i: int = 0) -> RequestRecord:
    return RequestRecord(request_id=i, query_id="q", dataset="d", prompt="p")


async def test_connections_are_kept_alive_and_never_more_than_the_limit() -> None:
    network = ScriptedNetwork(*(Reply.sse([(i * MS, EVENT)]) for i in range(8)))
    client = StreamingClient(ClientConfig(base_url="http://s.test/v1", max_connections=3), 0, network)
    await client.send(record(), b"{}")
    await client.send(record(1), b"{}")
    assert network.opened == 1  # the second request reused the first's connection
    records = [record(i) for i in range(6)]
    await asyncio.gather(*(client.send(r, b"{}") for r in records))
    await client.aclose()
    assert all(r.status is Status.OK for r in records)
    assert network.opened == 3


async def test_a_response_that_is_not_http_is_a_disconnect_that_says_so() -> None:
    rec, _ = await scripted_send(Reply([(1 * MS, b"SSH-2.0-OpenSSH_9.6\r\n\r\n")]))
    assert rec.error_type is ErrorType.DISCONNECT
    assert "not valid HTTP/1.1" in (rec.error_message or "")


async def test_a_read_timeout_is_a_timeout(sim: SimulatorProcess) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
    port = server.sockets[0].getsockname()[1]
    client = StreamingClient(ClientConfig(base_url=f"http://127.0.0.1:{port}/v1", read_timeout=0.3), 0)
    rec = record()
    async with server:
        await client.send(rec, b"{}")
        await client.aclose()
    assert rec.error_type is ErrorType.TIMEOUT and "for 0.3 s" in (rec.error_message or "")


async def test_httpx_over_the_pool_streams_and_raises_httpx_errors() -> None:
    network = ScriptedNetwork(Reply([(1 * MS, STREAM)]), Reply([(1 * MS, STREAM[:60])], close=True))
    async with httpx.AsyncClient(transport=PoolTransport(ConnectionPool(network=network))) as http:
        async with http.stream("POST", "http://s.test/v1/x", json={"a": 1}) as response:
            body = b"".join([part async for part in response.aiter_bytes()])
        assert response.status_code == 200 and body == EVENT + b"\n\n"
        assert network.requests[0].endswith(b'{"a":1}') or network.requests[0].endswith(b'{"a": 1}')
        with pytest.raises(httpx.RemoteProtocolError, match="mid-response") as failed:
            await http.get("http://s.test/v1/y")
        assert failed.value.request.url.path == "/v1/y"


def test_proxies_come_from_the_environment_as_curl_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://user:pw@proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "internal.corp")
    via = route_for("http://gpu.example:8000/v1/models")
    assert via.connect == ("proxy.corp", 3128) and via.target == b"http://gpu.example:8000/v1/models"
    assert b"proxy-authorization: Basic dXNlcjpwdw==" in via.fixed
    assert route_for("http://internal.corp/v1").connect == ("internal.corp", 80)
    assert route_for("http://127.0.0.1:8000/v1").connect == ("127.0.0.1", 8000)  # loopback: never proxied
    monkeypatch.setenv("HTTPS_PROXY", "socks5://proxy.corp:1080")
    with pytest.raises(ValueError, match="only http:// proxies"):
        route_for("https://api.example/v1")


# --- TLS and proxies over real sockets -------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@contextlib.asynccontextmanager
async def tls_server(ca: trustme.CA) -> AsyncIterator[int]:
    """An HTTPS server on loopback, for ``server.test``, answering every request with one event."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("server.test", "127.0.0.1").configure_cert(context)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            writer.write(STREAM)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    async with server:
        yield server.sockets[0].getsockname()[1]


@contextlib.asynccontextmanager
async def proxy_server(upstream_port: int, seen: list[bytes]) -> AsyncIterator[int]:
    """A forward proxy on loopback: CONNECT tunnels, and absolute-URL requests forwarded, all
    to ``upstream_port`` whatever host they name (the names resolve nowhere else)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n")[0])
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        if head.startswith(b"CONNECT "):
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            up_writer.write(head)
        with contextlib.suppress(asyncio.CancelledError):  # the test is over: stop piping
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


@pytest.fixture
def trusted(ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test CA trusted the way a user trusts their own: SSL_CERT_FILE."""
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))


async def stream_once(base_url: str) -> RequestRecord:
    client = StreamingClient(ClientConfig(base_url=base_url, connect_timeout=5), 0)
    rec = record()
    await client.send(rec, b"{}")
    await client.aclose()
    return rec


async def test_tls_with_a_trusted_certificate_streams(ca: trustme.CA, trusted: None) -> None:
    async with tls_server(ca) as port:
        rec = await stream_once(f"https://127.0.0.1:{port}/v1")
    assert rec.status is Status.OK, rec.error_message
    assert rec.answer == "hi" and rec.http_status == 200


async def test_tls_through_a_proxy_tunnel_and_plain_http_through_a_forward_proxy(
    ca: trustme.CA, trusted: None, sim: SimulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    seen: list[bytes] = []
    async with tls_server(ca) as tls_port, proxy_server(tls_port, seen) as proxy_port:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy_port}")
        rec = await stream_once("https://server.test/v1")
    assert rec.status is Status.OK, rec.error_message
    assert rec.answer == "hi" and seen == [b"CONNECT server.test:443 HTTP/1.1"]

    sim_port = int(sim.base_url.rsplit(":", 1)[1].split("/")[0])
    seen.clear()
    async with proxy_server(sim_port, seen) as proxy_port:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_port}")
        client = StreamingClient(ClientConfig(base_url="http://sim.test:8000/v1"), 0)
        rec = record()
        await client.send(rec, BodyDefaults("sim-small").encode(prompt_fields("hello", True), 8))
        await client.aclose()
    assert rec.status is Status.OK, rec.error_message
    assert seen == [b"POST http://sim.test:8000/v1/chat/completions HTTP/1.1"]


async def test_an_untrusted_certificate_is_a_connect_error_that_names_it(ca: trustme.CA) -> None:
    async with tls_server(ca) as port:
        rec = await stream_once(f"https://127.0.0.1:{port}/v1")
    assert rec.error_type is ErrorType.CONNECT
    assert "TLS handshake" in (rec.error_message or "") and "CERTIFICATE_VERIFY_FAILED" in (
        rec.error_message or ""
    )


async def test_list_models_speaks_through_the_same_transport(sim: SimulatorProcess) -> None:
    assert await list_models(sim.base_url, None) == ["sim-small"]
    models = json.dumps({"data": [{"id": "m"}]}).encode()
    network = ScriptedNetwork(Reply.body(200, models))
    async with httpx.AsyncClient(transport=PoolTransport(ConnectionPool(network=network))) as http:
        assert (await http.get("http://s.test/v1/models")).json() == {"data": [{"id": "m"}]}


class _Wire(asyncio.Transport):
    def write(self, data: bytes) -> None:  # type: ignore[override]
        pass


async def test_reads_ready_together_are_all_stamped_before_any_is_parsed() -> None:
    clock = ManualClock()
    arrivals = Arrivals()
    loop = asyncio.get_running_loop()
    exchanges = [Exchange(loop, 0) for _ in range(2)]
    for exchange in exchanges:
        connection = Connection(clock, lambda c, reusable: None, None, arrivals)
        connection.connection_made(_Wire())
        connection.begin(exchange, b"POST / HTTP/1.1\r\n\r\n")
    for at, exchange in zip((1 * MS, 2 * MS), exchanges, strict=True):
        clock.now = at  # the loop reads one ready socket after the other
        exchange.connection.data_received(STREAM)  # type: ignore[union-attr]
    assert [e.status for e in exchanges] == [0, 0]  # nothing parsed while sockets are being read
    clock.now = 50 * MS  # however long the parsing then takes
    await asyncio.sleep(0)
    assert [e.headers_ns for e in exchanges] == [1 * MS, 2 * MS]
    assert [e.done for e in exchanges] == [True, True]
