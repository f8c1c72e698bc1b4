"""Request bodies: what a workload sends, over the run's defaults."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BodyDefaults:
    """What every streaming request carries unless its workload says otherwise: the model,
    max_tokens and temperature, and the user's ``--param`` values over everything."""

    model: str
    max_tokens: int = 256
    temperature: float | None = 0.0
    params: dict[str, Any] = field(default_factory=dict)

    def encode(self, fields: dict[str, Any], max_tokens: int | None = None) -> bytes:
        """A streaming request body from ``fields`` (messages or prompt, tools, stop, …)."""
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens or self.max_tokens,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(fields)
        body.update(self.params)
        return json.dumps(body).encode()


def prompt_fields(prompt: str, chat: bool, stop: tuple[str, ...] = ()) -> dict[str, Any]:
    """One user prompt as the endpoint takes it: chat messages, or a completion prompt with
    its stop sequences."""
    if chat:
        return {"messages": [{"role": "user", "content": prompt}]}
    return {"prompt": prompt} | ({"stop": list(stop)} if stop else {})
