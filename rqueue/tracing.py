"""OpenTelemetry tracing of messages, from their publish to their outcome
(docs/tracing.md), for both clients and both workers.

A publish runs in a producer span and carries its W3C trace context in one
header, ``traceparent``; a worker runs each handler in a consumer span
whose parent is that context (and linked to it), with the messaging
semantic conventions' attributes; a redelivery is an event of its span, and
dead-lettering a short span of the same trace with a ``dead_letter`` event.

Without the ``otel`` extra, or while no tracer provider is configured,
every function here returns at once and nothing is added to a message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from .errors import Reject

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed
    _trace = None  # type: ignore[assignment]

TRACE_HEADER = "traceparent"  # the one header a traced publish adds (W3C Trace Context)
SYSTEM = "rqueue"  # messaging.system
DELIVERY_COUNT = "messaging.rqueue.message.delivery_count"

_OFF: contextlib.nullcontext[None] = contextlib.nullcontext(None)
_tracers: dict[int, Any] = {}  # id(provider) -> (provider, its tracer)


class Traced(Protocol):
    """What a span needs of a delivery (both clients' deliveries have it)."""

    seq: int
    delivery_count: int
    headers: dict[str, str]


_provider: Any = None  # set by use(): rqueue's own provider, before the global one


def use(provider: Any) -> None:
    """Traces rqueue with ``provider`` (an OpenTelemetry TracerProvider)
    rather than the global one; None goes back to the global one."""
    global _provider
    _provider = provider


def tracer() -> Any:
    """rqueue's tracer of the configured provider (:func:`use`, else the
    global one); None when OpenTelemetry is not installed or no provider is
    configured."""
    if _trace is None:
        return None
    # The global provider as set_tracer_provider stored it, read without
    # get_tracer_provider(), which looks at the environment on every call
    # while none is set: this runs once per publish and per handler run.
    provider = _provider if _provider is not None else getattr(_trace, "_TRACER_PROVIDER", None)
    if provider is None or isinstance(provider, (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)):
        return None
    hit = _tracers.get(id(provider))
    if hit is None or hit[0] is not provider:
        hit = _tracers[id(provider)] = (provider, provider.get_tracer("rqueue"))
    return hit[1]


def _attributes(queue: str, operation: str, group: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }
    if group is not None:
        out["messaging.consumer.group.name"] = group
    return out


def sending(queue: str, payloads: object) -> contextlib.AbstractContextManager[str | None]:
    """The producer span of a publish of ``payloads`` to ``queue``: a
    context manager giving the ``traceparent`` header value its messages
    carry, or None (and no span) when tracing is off."""
    t = tracer()
    if t is None:
        return _OFF
    return _sending(t, queue, payloads)


@contextlib.contextmanager
def _sending(t: Any, queue: str, payloads: object) -> Iterator[str | None]:
    attributes = _attributes(queue, "send")
    count = len(payloads) if isinstance(payloads, (list, tuple)) else 1
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with t.start_as_current_span(f"send {queue}", kind=_trace.SpanKind.PRODUCER, attributes=attributes):
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        yield carrier.get(TRACE_HEADER)


def with_trace(headers: list[Any], trace: str | None) -> list[Any]:
    """Each message's headers with ``traceparent`` added (a header the
    caller set is kept)."""
    if trace is None:
        return headers
    return [h if h is not None and TRACE_HEADER in h else {**(h or {}), TRACE_HEADER: trace} for h in headers]


def _parent(headers: Mapping[str, str]) -> Any:
    value = headers.get(TRACE_HEADER)
    if not value:
        return None
    return TraceContextTextMapPropagator().extract({TRACE_HEADER: value})


def processing(queue: str, group: str, delivery: Traced) -> contextlib.AbstractContextManager[Any]:
    """The consumer span of one handler run on ``delivery``: a child of the
    publish's context (and linked to it); an exception from the handler is
    recorded on it and raised on. Nothing when tracing is off."""
    t = tracer()
    if t is None:
        return _OFF
    return _processing(t, queue, group, delivery)


@contextlib.contextmanager
def _processing(t: Any, queue: str, group: str, d: Traced) -> Iterator[Any]:
    parent = _parent(d.headers)
    links = []
    if parent is not None:
        linked = _trace.get_current_span(parent).get_span_context()
        if linked.is_valid:
            links.append(_trace.Link(linked))
    attributes = _attributes(queue, "process", group)
    attributes["messaging.message.id"] = str(d.seq)
    attributes[DELIVERY_COUNT] = d.delivery_count
    with t.start_as_current_span(
        f"process {queue}",
        context=parent,
        kind=_trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        if d.delivery_count > 1:
            span.add_event("redelivery", {DELIVERY_COUNT: d.delivery_count})
        try:
            yield span
        except Reject as exc:
            span.add_event("reject", {"reason": exc.reason})
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def dead_lettered(queue: str, group: str, delivery: Traced, reason: str) -> None:
    """Records that ``delivery`` was dead-lettered (or dropped, under
    dead_letter none): a span of the message's trace with a ``dead_letter``
    event."""
    t = tracer()
    if t is None:
        return
    attributes = _attributes(queue, "settle", group)
    attributes["messaging.message.id"] = str(delivery.seq)
    attributes[DELIVERY_COUNT] = delivery.delivery_count
    with t.start_as_current_span(
        f"dead_letter {queue}", context=_parent(delivery.headers), kind=_trace.SpanKind.INTERNAL, attributes=attributes
    ) as span:
        span.add_event("dead_letter", {"reason": reason, DELIVERY_COUNT: delivery.delivery_count})
