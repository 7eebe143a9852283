"""The RNIC: one node (``node.py``: :class:`Rnic`, every block wired together) and its blocks.

* host-facing: the MMIO front end (``mmio.py``), doorbell registers and BlueFlame
  (``doorbell.py``, ``bf_buffer.py``), the command interface and QP state machine
  (``context.py``), asynchronous events (``events.py``), counters (``counters.py``);
* the requester: per-QP state and queues (``requester.py``, ``req_state.py``), the send
  engine (``send_engine.py``), its processing units
  (``requester_units.py``), WQE fetch (``fetch_issuer.py``, ``wqe_fetch.py``), local checks
  and request headers (``wqe_check.py``, ``request_header.py``), the packet emitter
  (``packet_emitter.py``), the response engine (``response_engine.py``,
  ``response_check.py``), the completion path (``completion_gate.py``), the tracker's
  layout (``tracker.py``), retry timers (``retry_timer.py``);
* the responder (``responder.py``), its checks (``request_check.py``), write gate
  (``responder_gate.py``) and ordered response queue (``response_queue.py``), the atomic
  unit (``atomic.py``);
* the completion engine (``completion.py``) and the receive demux (``dispatch.py``).

The network side is in ``hw/net/``, context caches in ``hw/ctx/``, the host interface in
``hw/dma/``, shared blocks in ``hw/lib/``.
"""

__all__ = ["Rnic"]


def __getattr__(name):
    # imported on first use: the requester and the responder import blocks of this package,
    # and node.py imports them (an eager import here would be circular)
    if name == "Rnic":
        from .node import Rnic
        return Rnic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
