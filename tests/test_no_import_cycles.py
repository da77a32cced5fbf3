"""pyllm's modules import one way: no circle, counting imports made inside functions too."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "pyllm"


def _modules() -> dict[str, pathlib.Path | None]:
    """Dotted name -> source file (None for a compiled module, which imports nothing of ours)."""
    out: dict[str, pathlib.Path | None] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in PACKAGE.rglob("*.pyx"):
        out.setdefault(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts), None)
    return out


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The modules of ours that running name's file imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module" and path.name == "__init__.py"):
            # a registry (pyllm/arch) that imports its own modules by name imports all of them
            found.update(m for m in modules if m.rpartition(".")[0] == name)
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            # `from . import x` imports the submodule x when there is one, else a name of the package
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            # importing a.b.c runs the packages a.b and a first; a package that holds name is
            # running already (the root package runs before any of us)
            found.update(".".join(parts[:i]) for i in range(2, len(parts) + 1)
                         if ".".join(parts[:i]) in modules and not name.startswith(".".join(parts[:i]) + "."))
            if target == PACKAGE.name:
                found.add(target)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_graph_holds_function_level_imports():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items() if path is not None}
    assert "pyllm.chat_sandbox" in graph["pyllm.chat"]  # imported inside render_chat only


def test_no_import_cycles_in_pyllm():
    modules = _modules()
    graph = {name: (_imports(name, path, modules) if path is not None else set()) for name, path in modules.items()}
    assert _cycles(graph) == []
