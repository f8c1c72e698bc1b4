"""Tools an agent may call: real Python functions the harness runs, each call timed.

A tool takes one string and returns one string; a :class:`ToolError` is the tool refusing its
input, and its message goes back to the model as the result. ``--tool-latency`` adds a drawn
wait to every call, to emulate tools that live across a network.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from .._clock import now_ns
from .datasets._qa_facts import ATOMIC_NUMBERS, CAPITALS, MOUNTAINS


class ToolError(Exception):
    """A tool could not do what it was asked; the message is what the model is told."""


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ToolError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")


def format_number(value: float) -> str:
    """A whole number without a decimal point; others to 10 significant digits."""
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e15):
        return str(int(value))
    return f"{value:.10g}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly as written (no names, no calls)."""
    text = expression.strip().replace("×", "*").replace("^", "**")
    if not text:
        raise ToolError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r} as arithmetic") from None
    try:
        return format_number(_evaluate(tree.body))
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("result too large") from None


def _facts() -> dict[str, str]:
    facts = {f"capital of {country}": city for country, city in CAPITALS}
    for element, number in ATOMIC_NUMBERS:
        facts[f"atomic number of {element}"] = str(number)
        facts[f"element with atomic number {number}"] = element
    facts |= {f"height of {mountain} in metres": str(metres) for mountain, metres in MOUNTAINS}
    return {_key(k): v for k, v in facts.items()}


def _key(text: str) -> str:
    text = " ".join(text.lower().replace("meters", "metres").split()).strip(" ?.")
    return text.removeprefix("the ")


KNOWLEDGE: dict[str, str] = _facts()


def lookup(key: str) -> str:
    """A fact from the built-in knowledge base, e.g. ``capital of France``."""
    found = KNOWLEDGE.get(_key(key))
    if found is None:
        raise ToolError(f"no entry for {key.strip()!r}")
    return found


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameter: str  # the one argument's name in the tool-calling schema
    run: Callable[[str], str]
    blocking: bool = False  # run in a worker thread, off the event loop

    def spec(self) -> dict[str, object]:
        """The OpenAI tool-calling description of this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {self.parameter: {"type": "string"}},
                    "required": [self.parameter],
                },
            },
        }

    def argument(self, arguments: str) -> str:
        """The argument from a tool call's JSON ``arguments``; raises ToolError when malformed."""
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            raise ToolError(f"arguments are not JSON: {arguments[:80]!r}") from None
        if isinstance(parsed, dict) and isinstance(parsed.get(self.parameter), str | int | float):
            return str(parsed[self.parameter])
        raise ToolError(f"expected {{{self.parameter!r}: string}}, got {arguments[:80]!r}")


BUILTIN_TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("calculator", "Evaluate an arithmetic expression, e.g. 3 * (4 + 5).", "expression", calculator),
        Tool("lookup", "Look a fact up, e.g. 'capital of France' or 'atomic number of iron'.", "key", lookup),
    )
}


@dataclass(frozen=True)
class ToolLatency:
    """Extra seconds drawn for every tool call: ``0``, ``0.2`` (fixed), ``exp:0.2`` (exponential
    with that mean) or ``lognormal:0.2,0.5`` (median, sigma)."""

    kind: str = "fixed"
    scale: float = 0.0
    sigma: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> ToolLatency:
        kind, _, rest = spec.strip().partition(":")
        try:
            if not rest:
                return cls("fixed", float(kind))
            if kind == "exp":
                return cls("exp", float(rest))
            if kind == "lognormal":
                median, sigma = rest.split(",")
                return cls("lognormal", float(median), float(sigma))
        except ValueError:
            pass
        raise ValueError(
            f"--tool-latency {spec!r}: expected seconds (0.2), exp:MEAN or lognormal:MEDIAN,SIGMA"
        )

    def draw(self, rng: random.Random) -> float:
        if self.kind == "exp":
            return rng.expovariate(1 / self.scale) if self.scale > 0 else 0.0
        if self.kind == "lognormal":
            return self.scale * rng.lognormvariate(0, self.sigma)
        return self.scale


@dataclass
class ToolResult:
    """One tool call as run: what went in, what the model is told, and how long it took."""

    name: str
    arguments: str
    output: str
    ok: bool
    latency_s: float  # measured, the emulated wait included
    started_ns: int  # on the run clock
    call_id: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "arguments": self.arguments,
            "output": self.output,
            "ok": self.ok,
            "latency_s": self.latency_s,
            "started_ns": self.started_ns,
        }


class Toolbox:
    """Runs tool calls by name, timing each one on the run clock."""

    def __init__(self, tools: dict[str, Tool] | None = None, latency: ToolLatency | None = None) -> None:
        self.tools = BUILTIN_TOOLS if tools is None else tools
        self.latency = latency or ToolLatency()

    def specs(self) -> list[dict[str, object]]:
        return [t.spec() for t in self.tools.values()]

    async def call(
        self,
        name: str,
        arguments: str,
        rng: random.Random,
        *,
        t0_ns: int,
        json_arguments: bool,
        call_id: str | None = None,
    ) -> ToolResult:
        """Run one call; a failure of any kind is a result the model sees, never an exception."""
        start = now_ns()
        perf = time.perf_counter()
        ok = True
        try:
            tool = self.tools.get(name)
            if tool is None:
                raise ToolError(f"unknown tool {name!r}; tools: {', '.join(self.tools)}")
            argument = tool.argument(arguments) if json_arguments else arguments
            if tool.blocking:
                output = await anyio.to_thread.run_sync(tool.run, argument)
            else:
                output = tool.run(argument)
        except ToolError as exc:
            ok, output = False, f"error: {exc}"
        except Exception as exc:  # a tool's own bug is the task's tool error, not the run's
            ok, output = False, f"error: {type(exc).__name__}: {exc}"
        wait = self.latency.draw(rng)
        if wait > 0:
            await anyio.sleep(wait)
        return ToolResult(
            name=name,
            arguments=arguments,
            output=output,
            ok=ok,
            latency_s=time.perf_counter() - perf,
            started_ns=start - t0_ns,
            call_id=call_id,
        )


__all__ = ["BUILTIN_TOOLS", "KNOWLEDGE", "Tool", "ToolError", "ToolLatency", "ToolResult", "Toolbox"]
