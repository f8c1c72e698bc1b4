"""Tools an agent may call, each call timed: the built-in Python functions run here, or the
tools of MCP servers (:mod:`.mcp_tools`), behind one :class:`Toolbox`.

A built-in tool takes one string and returns one string; a :class:`ToolError` is a tool
refusing its input (or a call failing), and its message goes back to the model as the result.
``--tool-latency`` adds a drawn wait to every call, to emulate tools that live across a network.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import operator
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from .._clock import now_ns
from .datasets._qa_facts import ATOMIC_NUMBERS, CAPITALS, MOUNTAINS


class ToolError(Exception):
    """A tool could not do what it was asked; the message is what the model is told."""


# Whole numbers are exact, so their size has no end but memory: nested powers such as
# ((9**64)**64)**64 reach gigabytes in a few levels. A whole number of more digits than this is
# refused, a power before it is computed; the other operations on numbers this size are cheap.
MAX_DIGITS = 100
_MAX_INT = 10**MAX_DIGITS
TOO_LARGE = f"result too large (more than {MAX_DIGITS} digits)"


def _power(base: float, exponent: float) -> float:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent * math.log10(abs(base)) > MAX_DIGITS
    ):
        raise ToolError(TOO_LARGE)
    return operator.pow(base, exponent)


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_evaluate(node.operand))
    else:
        raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")
    if isinstance(value, complex):  # (-8) ** (1/3)
        raise ToolError("the result is not a real number")
    if isinstance(value, int) and abs(value) >= _MAX_INT:
        raise ToolError(TOO_LARGE)
    if isinstance(value, float) and not math.isfinite(value):  # 1e308 * 10
        raise ToolError("result too large")
    return value


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
    except (MemoryError, RecursionError):  # the parser's own limit on nesting
        raise ToolError("expression too deeply nested") from None
    try:
        return format_number(_evaluate(tree.body))
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("result too large") from None
    except RecursionError:
        raise ToolError("expression too deeply nested") from None


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
class ToolSpec:
    """A tool as the model is offered it: what it does, the JSON Schema of its arguments, and
    the MCP server it lives on (None: a function run in this process)."""

    name: str
    description: str
    schema: dict[str, Any]
    server: str | None = None

    def openai(self) -> dict[str, object]:
        """The OpenAI tool-calling description."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.schema},
        }

    @property
    def properties(self) -> dict[str, Any]:
        found = self.schema.get("properties")
        return found if isinstance(found, dict) else {}

    def react_line(self) -> str:
        """How a ReAct prompt lists it: ``name[input]: description``."""
        names = list(self.properties)
        what = names[0] if len(names) == 1 else f"JSON object of {', '.join(names)}" if names else ""
        return f"{self.name}[{what}]: {self.description}"

    def arguments(self, text: str, json_arguments: bool) -> dict[str, Any]:
        """A call's arguments as an object: tool calling's JSON, or a ReAct action's input (the
        argument of a one-argument tool; a JSON object otherwise). ToolError when malformed."""
        properties = self.properties
        if not json_arguments and len(properties) <= 1:
            return {name: _as_type(text.strip(), schema) for name, schema in properties.items()}
        try:
            parsed = json.loads(text or "{}")
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ToolError(f"arguments must be a JSON object, got {text[:80]!r}")
        return parsed


def _as_type(text: str, schema: object) -> object:
    """A ReAct input for an argument that is not a string (a number, say): its JSON value."""
    if isinstance(schema, dict) and schema.get("type", "string") != "string":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # the server's schema check tells the model what it expected
    return text


@dataclass(frozen=True)
class Tool:
    """A Python function as a tool: one text argument in, text out."""

    name: str
    description: str
    parameter: str  # the one argument's name in the tool-calling schema
    run: Callable[[str], str]
    blocking: bool = False  # run in a worker thread, off the event loop

    def spec(self) -> ToolSpec:
        """How it is offered (by this process, or by the built-in MCP server)."""
        schema = {
            "type": "object",
            "properties": {self.parameter: {"type": "string"}},
            "required": [self.parameter],
        }
        return ToolSpec(self.name, self.description, schema)

    def call(self, arguments: dict[str, Any]) -> str:
        """Run it on a call's arguments; ToolError when its argument is missing or not text."""
        value = arguments.get(self.parameter)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ToolError(f"expected {{{self.parameter!r}: string}}, got {json.dumps(arguments)[:80]}")
        return self.run(str(value))


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
    server: str | None = None  # the MCP server's label; None: run in this process
    error: str | None = None  # why it failed, on one line

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "arguments": self.arguments,
            "output": self.output,
            "ok": self.ok,
            "latency_s": self.latency_s,
            "started_ns": self.started_ns,
            "server": self.server,
            "result_bytes": self.result_bytes,
            "error": self.error,
        }

    @property
    def result_bytes(self) -> int:
        """The size of what the model is sent (UTF-8 bytes)."""
        return len(self.output.encode())


class ToolSource(Protocol):
    """Where tools run: Python functions here (:class:`FunctionTools`) or MCP servers
    (:class:`~.mcp_tools.McpTools`)."""

    @property
    def tools(self) -> dict[str, ToolSpec] | None:
        """What it offers, by name; None until it is opened, where it must be asked."""
        ...

    def opened(self) -> AbstractAsyncContextManager[None]:
        """While open, its tools can be called (servers started and asked for their tools)."""
        ...

    async def run(self, name: str, arguments: dict[str, Any]) -> str:
        """The text tool ``name`` returns; ToolError with the reason when the call failed."""
        ...


class FunctionTools:
    """Tools that are Python functions, run in this process (the default: the built-in ones)."""

    def __init__(self, functions: dict[str, Tool] | None = None) -> None:
        self.functions = BUILTIN_TOOLS if functions is None else functions
        self.tools: dict[str, ToolSpec] | None = {name: t.spec() for name, t in self.functions.items()}

    def opened(self) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def run(self, name: str, arguments: dict[str, Any]) -> str:
        tool = self.functions[name]
        if tool.blocking:
            return await anyio.to_thread.run_sync(tool.call, arguments)
        return tool.call(arguments)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters: a failure's reason in a log."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class Toolbox:
    """Runs tool calls by name from its source, timing each one on the run clock."""

    def __init__(
        self, tools: dict[str, Tool] | ToolSource | None = None, latency: ToolLatency | None = None
    ) -> None:
        """``tools``: Python functions by name (default: the built-in ones), or a source such as
        :class:`~.mcp_tools.McpTools`."""
        self.source: ToolSource = FunctionTools(tools) if tools is None or isinstance(tools, dict) else tools
        self.latency = latency or ToolLatency()

    @property
    def tools(self) -> dict[str, ToolSpec] | None:
        """The tools by name; None until :meth:`opened` where the source must be asked."""
        return self.source.tools

    def opened(self) -> AbstractAsyncContextManager[None]:
        return self.source.opened()

    def offered(self, names: Sequence[str] | None = None) -> list[ToolSpec]:
        """The tools a task is offered: those ``names`` (its own list), or every one."""
        tools = self.tools
        if tools is None:
            raise RuntimeError("the toolbox is not open: perform units inside the workload's opened()")
        return list(tools.values()) if names is None else [tools[n] for n in names]

    async def call(
        self,
        name: str,
        arguments: str,
        rng: random.Random,
        *,
        t0_ns: int,
        json_arguments: bool,
        call_id: str | None = None,
        offered: Sequence[str] | None = None,
    ) -> ToolResult:
        """Run one call of a tool among ``offered`` (default: all); a failure of any kind is a
        result the model sees, never an exception."""
        start = now_ns()
        perf = time.perf_counter()
        tools = self.tools or {}
        spec = tools.get(name) if offered is None or name in offered else None
        error = None
        try:
            if spec is None:
                names = tools if offered is None else offered
                raise ToolError(f"unknown tool {name!r}; tools: {', '.join(names) or 'none'}")
            output = await self.source.run(name, spec.arguments(arguments, json_arguments))
        except ToolError as exc:
            error = str(exc)
        except Exception as exc:  # a tool's own bug is the task's tool error, not the run's
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            output = f"error: {error}"
        wait = self.latency.draw(rng)
        if wait > 0:
            await anyio.sleep(wait)
        return ToolResult(
            name=name,
            arguments=arguments,
            output=output,
            ok=error is None,
            latency_s=time.perf_counter() - perf,
            started_ns=start - t0_ns,
            call_id=call_id,
            server=None if spec is None else spec.server,
            error=None if error is None else one_line(error),
        )


__all__ = [
    "BUILTIN_TOOLS",
    "KNOWLEDGE",
    "FunctionTools",
    "Tool",
    "ToolError",
    "ToolLatency",
    "ToolResult",
    "ToolSource",
    "ToolSpec",
    "Toolbox",
]
