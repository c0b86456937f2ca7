"""A model's state as Triton's repository index names it, and as ``/ping`` reports it.

``READY`` and ``UNAVAILABLE`` are Triton's own words (a model with no state in the index is
``UNAVAILABLE``, as is a served model the index does not list); ``UNKNOWN`` is ours, for a model
whose state could not be asked (Triton did not answer).
"""

from __future__ import annotations

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
UNKNOWN = "UNKNOWN"
