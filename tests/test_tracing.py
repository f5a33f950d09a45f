"""OpenTelemetry tracing (rqueue.tracing): a publish carries its trace
context in one header, both workers run each handler in a consumer span of
that trace, a redelivery and the dead-lettering are recorded in it; with
no tracer configured nothing is added."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.servers import wait_for
from test_aio_worker import run_worker

import rqueue
import rqueue.aio
from rqueue import tracing

BACKENDS = pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)


@pytest.fixture
def spans():
    """An in-memory exporter of the spans rqueue makes (its own provider,
    not the process's global one, so that other tests stay untraced)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter, provider.get_tracer("test")
    tracing.use(None)


@BACKENDS
@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_one_trace_from_publish_through_a_redelivery_to_the_dead_letter(kind, spans, backend, prefix):
    exporter, tracer = spans
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", max_deliveries=2)
    q = client.queue("orders")
    # given a message published inside a request's span
    with tracer.start_as_current_span("request"):
        seq = q.publish(b"x", headers={"k": "v"}).seq
    [stored] = q.peek()
    assert set(stored.headers) == {"k", "traceparent"}  # one header added

    # when a worker fails on it until it is dead-lettered
    def handler(d):
        raise ValueError("boom")

    w = run_worker(kind, backend, prefix, q, handler, concurrency=1)
    wait_for(lambda: q.dead_letter_queue.peek())
    wait_for(lambda: any(s.name == "dead_letter orders" for s in exporter.get_finished_spans()))
    w.stop()
    assert w.join(10)

    # then every span is in the request's trace
    finished = exporter.get_finished_spans()
    by_name: dict[str, list] = {}
    for s in finished:
        by_name.setdefault(s.name, []).append(s)
    request = by_name["request"][0]
    assert {s.context.trace_id for s in finished} == {request.context.trace_id}
    [send] = by_name["send orders"]
    assert send.kind is trace.SpanKind.PRODUCER and send.parent.span_id == request.context.span_id
    assert stored.headers["traceparent"].split("-")[2] == format(send.context.span_id, "016x")
    first, second = sorted(by_name["process orders"], key=lambda s: s.attributes[tracing.DELIVERY_COUNT])
    for n, span in enumerate((first, second), start=1):
        # a consumer span, child of the publish and linked to it, with the messaging conventions
        assert span.kind is trace.SpanKind.CONSUMER
        assert span.parent.span_id == send.context.span_id
        assert [link.context.span_id for link in span.links] == [send.context.span_id]
        assert dict(span.attributes) == {
            "messaging.system": "rqueue",
            "messaging.destination.name": "orders",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": "g",
            "messaging.message.id": str(seq),
            tracing.DELIVERY_COUNT: n,
        }
        assert span.status.status_code is trace.StatusCode.ERROR
        assert "exception" in [e.name for e in span.events]
    assert "redelivery" not in [e.name for e in first.events]
    assert [dict(e.attributes) for e in second.events if e.name == "redelivery"] == [{tracing.DELIVERY_COUNT: 2}]
    [dead] = by_name["dead_letter orders"]
    assert dead.parent.span_id == send.context.span_id
    assert [(e.name, e.attributes["reason"]) for e in dead.events] == [("dead_letter", "max-deliveries")]
    client.close()


def test_a_reject_is_an_event_not_an_error(spans, prefix):
    exporter, tracer = spans
    client = rqueue.connect("memory://reject-" + prefix, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"x")

    def handler(d):
        raise rqueue.Reject("not for us")

    w = run_worker("threaded", "", prefix, q, handler, concurrency=1)
    wait_for(lambda: any(s.name == "dead_letter orders" for s in exporter.get_finished_spans()))
    w.stop()
    assert w.join(10)
    [process] = [s for s in exporter.get_finished_spans() if s.name == "process orders"]
    assert process.status.status_code is trace.StatusCode.UNSET
    assert [(e.name, dict(e.attributes)) for e in process.events] == [("reject", {"reason": "not for us"})]
    client.close()


def test_the_async_client_publishes_with_the_trace_header(spans, prefix):
    exporter, tracer = spans
    url = "memory://aio-trace-" + prefix

    async def main() -> None:
        client = await rqueue.aio.connect(url, prefix=prefix)
        with tracer.start_as_current_span("request"):
            await client.queue("orders").publish_many([b"a", b"b"])
        await client.close()

    asyncio.run(main())
    [send] = [s for s in exporter.get_finished_spans() if s.name == "send orders"]
    assert send.attributes["messaging.batch.message_count"] == 2
    messages = rqueue.connect(url, prefix=prefix).queue("orders").peek()
    parents = {m.headers["traceparent"].split("-")[2] for m in messages}
    assert parents == {format(send.context.span_id, "016x")}


def test_a_traceparent_the_caller_set_is_kept(spans, prefix):
    _, tracer = spans
    q = rqueue.connect("memory://own-" + prefix, prefix=prefix).queue("orders")
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracer.start_as_current_span("request"):
        q.publish_many([b"a", b"b"], headers=[{"traceparent": own}, None])
    assert [m.headers["traceparent"] == own for m in q.peek()] == [True, False]


def test_without_a_tracer_nothing_is_added(prefix):
    # the process has no tracer provider (the global one is OpenTelemetry's no-op proxy)
    assert tracing.tracer() is None
    q = rqueue.connect("memory://off-" + prefix, prefix=prefix).queue("orders")
    q.publish(b"a")
    q.publish(b"b", headers={"k": "v"})
    assert [m.headers for m in q.peek()] == [{}, {"k": "v"}]
    assert tracing.sending("orders", [b"a"]).__enter__() is None


def test_a_malformed_traceparent_starts_a_trace_of_its_own(spans):
    exporter, _ = spans

    class Hostile:
        seq, delivery_count = 7, 1
        headers = {"traceparent": "00-zz-not-a-trace\r\n"}

    with tracing.processing("orders", "g", Hostile()):
        pass
    tracing.dead_lettered("orders", "g", Hostile(), "rejected")
    process, dead = exporter.get_finished_spans()
    assert process.parent is None and process.links == ()
    assert dead.parent is None


def test_the_global_tracer_provider_is_used_when_one_is_set(prefix):
    # in a process of its own: a global provider cannot be unset
    script = f"""
import rqueue
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
q = rqueue.connect("memory://", prefix={prefix!r}).queue("orders")
with trace.get_tracer("app").start_as_current_span("request"):
    q.publish(b"x")
print(sorted(q.peek()[0].headers))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "['traceparent']"
