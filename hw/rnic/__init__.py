"""The RNIC: one node (``node.py``: :class:`Rnic`, every block wired together) and the
blocks split out of the requester and the responder (issue 8, section 6).

* ``response_queue.py``: the responder's ordered response queue, READ prefetcher and
  transmitter;
* ``packet_emitter.py``: the requester's header FIFO and payload buffer, store and forward.

The other blocks still live one level up (``hw/requester.py``, ``hw/responder.py``, ...);
they move here as they are split.
"""

__all__ = ["Rnic"]


def __getattr__(name):
    # imported on first use: the requester and the responder import blocks of this package,
    # and node.py imports them (an eager import here would be circular)
    if name == "Rnic":
        from .node import Rnic
        return Rnic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
