"""Example values for JSON schemas, seeded: the arguments a simulated model fills a tool call with.

A value honours its schema's ``type``, ``enum``/``const``, ``anyOf``/``oneOf`` (the first
branch that can be satisfied), ``allOf``, local ``$ref``, numeric bounds and ``multipleOf``,
string lengths and common formats, and array sizes; strings are made of words of the question,
so a call reads like one a model made. ``pattern`` and ``not`` are not honoured (an optional
property with a pattern is left out).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any

_MAX_DEPTH = 8  # a recursive schema ($ref to itself) is cut here, where it allows
_MAX_SIZE = 4096  # longest string, most items: a schema asking for more is refused, not served
_SPAN = 20  # width of a numeric range with one bound or none
_FORMATS = {
    "date": "2024-05-17",
    "date-time": "2024-05-17T12:00:00Z",
    "time": "12:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
}
_WORD = re.compile(r"[A-Za-z0-9][\w'-]*")


class Unsatisfiable(ValueError):
    """No value of the schema could be made: it is ``false``, contradictory, malformed or too deep."""


def example_arguments(schema: object, rng: random.Random, text: str) -> dict[str, Any]:
    """Arguments for a tool whose parameters are ``schema``: an object that satisfies it, its
    strings made of words of ``text``; ``{}`` for a schema that is empty, not an object's,
    malformed or unsatisfiable (a model calls the tool all the same)."""
    if not isinstance(schema, dict):
        return {}
    try:
        value = _Examples(schema, rng, _WORD.findall(text) or ["example"]).value(schema)
    except Unsatisfiable:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class _Examples:
    root: dict[str, Any]  # what a "#/..." $ref points into
    rng: random.Random
    words: list[str]

    def value(self, schema: object, depth: int = 0) -> Any:
        try:
            return self._value(schema, depth)
        except Unsatisfiable:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as exc:
            # a hand-written schema can be malformed in any of these ways; to the caller that
            # is one more schema it cannot satisfy (an optional property it leaves out)
            raise Unsatisfiable(f"malformed schema: {exc!r}") from exc

    def _value(self, schema: object, depth: int) -> Any:
        if schema is True:
            return self._string({})
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            raise Unsatisfiable(f"no value for {schema!r}")
        if "$ref" in schema:
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        if "allOf" in schema:
            return self.value(_merge(schema), depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise Unsatisfiable("enum is not a list of values")
            return self.rng.choice(schema["enum"])
        if "default" in schema:
            return schema["default"]
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._first(schema[key], depth)
        kind = _type(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer" or (kind == "number" and _positive(schema.get("multipleOf"))):
            return self._multiple(schema, integer=kind == "integer")
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema)

    def _first(self, branches: list[object], depth: int) -> Any:
        for branch in branches:
            try:
                return self.value(branch, depth + 1)
            except Unsatisfiable:
                continue
        raise Unsatisfiable("no branch can be satisfied")

    def _resolve(self, ref: str) -> object:
        if not ref.startswith("#"):
            raise Unsatisfiable(f"cannot follow $ref {ref!r}")
        node: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties: dict[str, Any] = schema.get("properties") or {}
        listed = schema.get("required")
        required = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
        out: dict[str, Any] = {}
        for name, sub in properties.items():
            if name in required:
                out[name] = self.value(sub, depth + 1)
            # a model fills some optional arguments, not all; never one whose pattern it
            # cannot be sure to match
            elif not (isinstance(sub, dict) and "pattern" in sub) and self.rng.random() < 0.5:
                try:
                    out[name] = self.value(sub, depth + 1)
                except Unsatisfiable:
                    continue
        for name in sorted(required - out.keys()):  # required but never described: any value
            out[name] = self._string({})
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", max(low, 3)))
        if low > high or low > _MAX_SIZE:
            raise Unsatisfiable(f"no array of {low} to {high} items")
        items = schema.get("items", True)
        prefix = schema.get("prefixItems", items if isinstance(items, list) else None)
        if isinstance(prefix, list):  # a tuple: one schema per position
            return [self.value(sub, depth + 1) for sub in prefix]
        n = self.rng.randint(max(low, min(1, high)), max(low, min(high, 3)))
        unique = bool(schema.get("uniqueItems"))
        out: list[Any] = []
        for _ in range(4 * n if unique else n):  # a few spare draws to find distinct items
            if len(out) == n:
                break
            try:
                item = self.value(items, depth + 1)
            except Unsatisfiable:
                if low == 0:
                    return []
                raise
            if not (unique and item in out):
                out.append(item)
        if len(out) < low:
            raise Unsatisfiable(f"fewer than {low} distinct items")
        return out

    def _multiple(self, schema: dict[str, Any], integer: bool) -> float:
        """An integer, or a number with ``multipleOf``: a whole multiple of the step in range."""
        step = schema.get("multipleOf", 1)
        if not _positive(step) or (integer and not float(step).is_integer()):
            step = 1
        step = int(step) if float(step).is_integer() else step
        low, high = _bounds(schema)
        first = math.floor(low / step) + 1 if _exclusive(schema, "Minimum", low) else math.ceil(low / step)
        last = math.ceil(high / step) - 1 if _exclusive(schema, "Maximum", high) else math.floor(high / step)
        if first > last:
            raise Unsatisfiable(f"no multiple of {step} in [{low}, {high}]")
        return step * self.rng.randint(first, last)

    def _number(self, schema: dict[str, Any]) -> float:
        low, high = _bounds(schema)
        value = round(self.rng.uniform(low, high), 2)
        inside = (low < value or (value == low and not _exclusive(schema, "Minimum", low))) and (
            value < high or (value == high and not _exclusive(schema, "Maximum", high))
        )
        if inside:
            return value
        if low < high:  # rounding landed on or past an excluded bound
            return (low + high) / 2
        raise Unsatisfiable(f"no number in [{low}, {high}]")

    def _string(self, schema: dict[str, Any]) -> str:
        low = int(schema.get("minLength", 0))
        high = int(schema.get("maxLength", max(low, 200)))
        if low > high or low > _MAX_SIZE:
            raise Unsatisfiable(f"no string of {low} to {high} characters")
        text = _FORMATS.get(str(schema.get("format")))
        if text is None:
            start = self.rng.randrange(len(self.words))
            text = " ".join(self.words[start : start + self.rng.randint(1, 3)])
        while len(text) < low:
            text += " " + self.rng.choice(self.words)
        return text[:high]


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _number_or_none(value: object) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _type(schema: dict[str, Any]) -> str:
    """The schema's type (of a list, the first that is not null), else what its keywords imply."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null" if kind else None)
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "minItems" in schema:
        return "array"
    if "minimum" in schema or "maximum" in schema:
        return "number"
    return "string"


def _merge(schema: dict[str, Any]) -> dict[str, Any]:
    """``allOf`` flattened into one schema: properties and required lists joined."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for branch in schema["allOf"]:
        for key, value in branch.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged[key] = value
    return merged


def _bounds(schema: dict[str, Any]) -> tuple[float, float]:
    """The closed range a number is drawn from: the tightest of the schema's bounds (inclusive
    and exclusive), with ``_SPAN`` standing in for a missing one."""
    lows = [v for k in ("minimum", "exclusiveMinimum") if (v := _number_or_none(schema.get(k))) is not None]
    highs = [v for k in ("maximum", "exclusiveMaximum") if (v := _number_or_none(schema.get(k))) is not None]
    if not lows and not highs:
        return 1, _SPAN
    low = max(lows) if lows else min(highs) - _SPAN
    high = min(highs) if highs else low + _SPAN
    return low, high


def _exclusive(schema: dict[str, Any], bound: str, value: float) -> bool:
    """Whether ``value``, a bound from ``_bounds``, is excluded: ``exclusiveMinimum: 3`` (draft
    6 on) or ``exclusiveMinimum: true`` beside ``minimum`` (draft 4)."""
    flag = schema.get(f"exclusive{bound}")
    if isinstance(flag, bool):
        return flag
    return _number_or_none(flag) == value
