"""Over-saturation: requests arriving faster than the server finishes them."""

from __future__ import annotations

OVERSATURATION_ACTIONS = ("flag", "stop")
