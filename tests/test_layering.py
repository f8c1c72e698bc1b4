"""The package's layering, read from the source: no import circle, and the rules that keep each
room to its concern. Imports inside functions and under TYPE_CHECKING count: a lazy import is
still a dependency, and a circle through one is still a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "ipw_async"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exists(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The ipw_async modules ``path`` imports: ``from .x import y`` is ``x.y`` where y is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ipw_async"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "ipw_async":
                continue
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if exists(f"{target}.{alias.name}") else target)
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan). Every edge counts: a
    module importing its own package's ``__init__``, which imports it back, is a circle too."""
    edges = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in edges[m]:
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return found


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _private(module: str) -> bool:
    """A module named ``_x`` inside a package (not the package's own ``_clock`` and the like)."""
    name = module.rpartition(".")[2]
    return module.count(".") >= 2 and name.startswith("_") and not name.startswith("__")


def _owns(module: str, private: str) -> bool:
    """``module`` is in the private module's package, or in that package's parent below the root."""
    package = private.rpartition(".")[0]
    parent = package.rpartition(".")[0]
    return under(module, package) or (parent != "ipw_async" and under(module, parent))


def broken_rules(graph: dict[str, set[str]]) -> set[str]:
    why = {
        "harness": "the harness runs benchmarks; this room only reads or measures",
        "workload": "the client builds bodies from dataset rows",
        "telemetry.remote": "remote telemetry is the telemetry package's own business",
        "pool": "the run's ledger and the dispatch protocol know no pool",
        "finisher": "what reads a finished run, and the simulator, sit below the finisher and the package face",
        "private": "a package's private modules are its own (and its parent's): others use its public names",
    }
    out = set()
    for m, deps in graph.items():
        for d in deps:
            rule = None
            if any(under(m, f"ipw_async.{p}") for p in ("sim", "analysis", "telemetry")) and under(
                d, "ipw_async.harness"
            ):
                rule = "harness"
            elif under(m, "ipw_async.client") and under(d, "ipw_async.workload"):
                rule = "workload"
            elif under(d, "ipw_async.telemetry.remote") and not under(m, "ipw_async.telemetry"):
                rule = "telemetry.remote"
            elif any(under(m, f"ipw_async.{p}") for p in ("analysis", "export", "sim")) and (
                d in ("ipw_async", "ipw_async.results", "ipw_async.judge") or under(d, "ipw_async.harness")
            ):
                rule = "finisher"
            elif _private(d) and not _owns(m, d):
                rule = "private"
            elif m in ("ipw_async.harness.ledger", "ipw_async.harness.dispatch") and d in (
                "ipw_async.harness.workers",
                "ipw_async.harness.ray_pool",
            ):
                rule = "pool"
            if rule:
                out.add(f"{m} imports {d}: {why[rule]}")
    return out


def violations(graph: dict[str, set[str]]) -> set[str]:
    return {f"circle: {', '.join(c)}" for c in circles(graph)} | broken_rules(graph)


def test_the_package_keeps_its_layers() -> None:
    found = violations(import_graph())
    assert found == set()


def test_a_planted_violation_is_caught() -> None:
    graph = import_graph()
    graph["ipw_async.sim.engine"] = graph["ipw_async.sim.engine"] | {"ipw_async.harness.live"}
    graph["ipw_async.telemetry.base"] = graph["ipw_async.telemetry.base"] | {"ipw_async.rundir.read"}
    graph["ipw_async.harness.ledger"] = graph["ipw_async.harness.ledger"] | {"ipw_async.harness.workers"}
    found = violations(graph)
    assert (
        "ipw_async.harness.ledger imports ipw_async.harness.workers: "
        + ("the run's ledger and the dispatch protocol know no pool")
        in found
    )
    assert (
        "ipw_async.sim.engine imports ipw_async.harness.live: "
        + ("the harness runs benchmarks; this room only reads or measures")
        in found
    )
    # rundir.read reads telemetry.base: the planted edge back closes a circle
    assert any(v.startswith("circle: ") and "ipw_async.telemetry.base" in v for v in found)


def test_a_packages_private_modules_are_its_own() -> None:
    graph = import_graph()
    graph["ipw_async.proxy.relay"] = graph["ipw_async.proxy.relay"] | {"ipw_async.client._events"}
    graph["ipw_async.client._client"] = graph["ipw_async.client._client"] | {"ipw_async.client._events"}
    found = broken_rules(graph)
    why = "a package's private modules are its own (and its parent's): others use its public names"
    assert f"ipw_async.proxy.relay imports ipw_async.client._events: {why}" in found
    assert not any(v.startswith("ipw_async.client._client imports") for v in found)


def test_nothing_that_reads_a_finished_run_finishes_one() -> None:
    graph = import_graph()
    graph["ipw_async.export.otel"] = graph["ipw_async.export.otel"] | {"ipw_async.results"}
    graph["ipw_async.analysis.html_page"] = graph["ipw_async.analysis.html_page"] | {"ipw_async"}
    found = broken_rules(graph)
    why = "what reads a finished run, and the simulator, sit below the finisher and the package face"
    assert f"ipw_async.export.otel imports ipw_async.results: {why}" in found
    assert f"ipw_async.analysis.html_page imports ipw_async: {why}" in found


def test_one_module_reads_the_run_directorys_files() -> None:
    """Reading a run's records, telemetry, tasks, traces or verdicts is :class:`RunDir`'s: no
    other module opens those files (the writer and the finisher write them; sweeps and searches
    read their own folders' files)."""
    run_files = ("MEASURED", "RECORDS", "TELEMETRY", "TASKS", "TRACES", "JUDGE")
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) in ("read_arrow", "read_jsonl", "load_jsonl")
                and any(isinstance(n, ast.Attribute) and n.attr in run_files for n in ast.walk(node))
            ):
                readers.add(module_name(path))
    assert readers == {"ipw_async.rundir.read"}


@pytest.mark.parametrize(
    "init",
    ["__init__.py", "analysis/__init__.py", "energy/__init__.py", "harness/__init__.py", "sim/__init__.py", "telemetry/__init__.py"],
)
def test_a_lazy_package_lists_each_public_name_once_everywhere(init: str) -> None:
    """``ipw_async`` and its lazy packages name their exports three times (the lazy table,
    ``__all__``, the imports type checkers read): all three must agree."""
    tree = ast.parse((PACKAGE / init).read_text())
    table = next(n.value for n in tree.body if isinstance(n, ast.AnnAssign) and n.target.id == "_EXPORTS")  # type: ignore[union-attr]
    lazy = {k.value: f".{v.value}" for k, v in zip(table.keys, table.values, strict=True)}  # type: ignore[union-attr, attr-defined]
    listed = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__")  # type: ignore[attr-defined]
    typed = {
        a.name: f".{n.module}"
        for block in tree.body
        if isinstance(block, ast.If)
        for n in block.body
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    assert sorted(lazy) == sorted(e.value for e in listed.elts)  # type: ignore[attr-defined]
    assert typed == lazy


def test_the_graph_sees_relative_and_lazy_imports() -> None:
    graph = import_graph()
    assert "ipw_async.rundir.files" in graph["ipw_async.results"]  # from .rundir import files
    assert "ipw_async.harness.sweep" in graph["ipw_async.cli.analysis"]  # imported inside a function


def test_the_core_install_pulls_no_integration_sdk() -> None:
    """The extras stay extras: the core dependencies name none of their SDKs, and importing the
    CLI, every exporter and the MCP tool client loads none of them (each is imported where an
    export or a tool server needs it)."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    integrations = ("opentelemetry", "mlflow", "datasets", "playwright", "ray", "mcp")
    assert not [d for d in project["dependencies"] if d.startswith(integrations)]
    code = (
        "import sys, ipw_async.cli, ipw_async.export.otel, ipw_async.export.mlflow, ipw_async.analysis.html_report, "
        "ipw_async.workload.mcp_tools; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(integrations)!r}))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["run", "--concurrency", "0"]])
def test_the_command_line_answers_without_the_run_s_machinery(argv: list[str]) -> None:
    """``ipw-async --help``, a command's ``--help`` and a bad option load each command's library
    only when it runs: not scipy (the fit, the counter probes' solver, the validity tests), nor
    aiohttp (the simulator's and the proxy's servers). With them the CLI took 2.8 s to start on
    a 2-core host, and a bad option 3.2 s to be refused (benchmarks/startup.py)."""
    code = (
        "import sys; from ipw_async.cli import main; "
        f"sys.argv = ['ipw-async', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print(code, sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'aiohttp'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    code_seen, loaded = done.stdout.splitlines()[-1].split(maxsplit=1)  # after the help, if any
    assert loaded == "[]"
    assert code_seen == ("2" if "0" in argv else "0")
