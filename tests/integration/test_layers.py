"""The import layers: docs/ARCHITECTURE.md's drawing is pyproject.toml's import-linter contract, the contract holds,
and no import inside a function hides a cycle (the ones there are load something heavy or optional late)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "guardian"

# (importer prefix, imported module): why it is imported inside a function rather than at the top
LATE_IMPORTS: dict[tuple[str, str], str] = {
    ("guardian.cli", ""): "a command's modules load when it runs, so `guardian --help` and each command start fast",
    ("", "guardian.dashboards.grafana"): "the Grafana client (~10 MB) loads only when Grafana is configured",
    ("guardian.commands.doctor", "guardian.notify.setup"): "doctor's webhook check loads the notifiers only then",
    ("guardian.rescue.ray_jobs", "guardian.rescue.ray_client"): "ray is optional: only --ray-address needs it",
    ("guardian.store.engine", "guardian.store.postgres"): "the PostgreSQL driver loads only for a postgresql URL",
}


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["id"] == "layers"]
    return [" ".join(layer.split()) for layer in layers["layers"]]


def drawn_layers() -> list[str]:
    """The layer column of the block under the marker comment in docs/ARCHITECTURE.md."""
    lines = iter((ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines())
    for line in lines:
        if line.startswith("<!-- the import layers"):
            break
    assert next(lines).startswith("```"), "the marker is followed by a fenced block"
    drawn = []
    for line in lines:
        if line.startswith("```"):
            return drawn
        drawn.append(" ".join(line.split("  ")[0].split()))
    raise AssertionError("the layers block is not closed")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def guardian_imports(path: Path) -> Iterator[tuple[str, bool]]:
    """Each guardian module ``path`` imports, and whether the import sits inside a function."""
    name, tree = module_name(path), ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                yield from ((alias.name, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - child.level + 1] if child.level else []
                target = ".".join([*base, child.module] if child.module else base)
                yield from ((f"{target}.{alias.name}", inside) for alias in child.names)
            yield from visit(child, inside)

    for target, inside in visit(tree, False):
        if target.split(".")[0] == "guardian":
            yield target, inside


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """Every guardian module's guardian imports (a name imported from a module counts as the module), and the
    imports made inside functions."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    late = []
    for name, path in modules.items():
        for target, inside in guardian_imports(path):
            while target not in modules:
                target = target.rpartition(".")[0]
            if target != name:
                graph[name].add(target)
                if inside:
                    late.append((name, target))
    return graph, late


def test_the_drawing_is_the_contract() -> None:
    assert drawn_layers() == contract_layers()


def test_every_top_level_module_and_package_has_a_layer() -> None:
    drawn = {name for layer in drawn_layers() for name in layer.replace(":", "|").replace(" ", "").split("|")}
    present = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    present |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert drawn == present


def test_the_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_no_module_import_cycle_even_through_imports_inside_functions() -> None:
    graph, _ = import_graph()
    done: set[str] = set()

    def cycle_from(start: str) -> list[str] | None:
        path, on_path, stack = [start], {start}, [iter(sorted(graph[start]))]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                stack.pop()
                on_path.discard(path.pop())
                continue
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done:
                path.append(target)
                on_path.add(target)
                stack.append(iter(sorted(graph[target])))
        return None

    for module in sorted(graph):
        cycle = cycle_from(module)
        assert cycle is None, " -> ".join(cycle)
        done.add(module)


def test_each_import_inside_a_function_has_its_reason() -> None:
    _, late = import_graph()
    unexplained = [
        f"{importer} -> {imported}"
        for importer, imported in late
        if not any(importer.startswith(prefix) and imported.startswith(target) for prefix, target in LATE_IMPORTS)
    ]
    assert not unexplained, "import at the top, or add the reason to LATE_IMPORTS: " + ", ".join(unexplained)
