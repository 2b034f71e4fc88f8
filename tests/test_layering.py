"""Imports point down the layers of docs/architecture.md: cli → train/bench/viewer → data/io →
rendering → ops → backends, and no module takes part in an import circle. A test fails when an
import points upward or closes a circle."""

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tilesplat"
LAYER = {
    "constants": -1,
    "sh_rgb": -1,
    "devices": -1,
    "keys": -1,
    "lookup": -1,
    "command_env": -1,
    "assets": -1,
    "__version__": -1,
    "backends": 0,
    "ops": 1,
    "rendering": 2,
    "distributed": 2,
    "ranks": 2,
    "data": 3,
    "strategy": 3,
    "optimizers": 3,
    "compression": 3,
    "exporter": 3,
    "io": 3,
    "train": 4,
    "bench": 4,
    "viewer": 4,
    "cli": 5,
    "__init__": 6,
    "__main__": 6,
}


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    return rel.parts[0]


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(SRC).with_suffix("")
    pkg_parts = ["tilesplat", *rel.parts[:-1]]
    if rel.parts[-1] == "__init__":
        pkg_parts = ["tilesplat", *rel.parts[:-1]]
    modules = _modules()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # from X import y: the module X.y when there is one, else X
            names = {f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod
                     for a in node.names}
            for name in sorted(names):
                yield node.lineno, name
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name


def test_imports_point_down():
    problems = []
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    for path in files:
        here = _package_of(path)
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] != "tilesplat" or len(parts) < 2:
                continue
            there = parts[1]
            if there not in LAYER:
                problems.append(f"{path.relative_to(SRC)}:{line} imports unknown {name}")
            elif LAYER[there] > LAYER[here]:
                problems.append(f"{path.relative_to(SRC)}:{line} ({here}) imports {name}")
    assert not problems, "imports pointing upward:\n" + "\n".join(problems)


def test_backends_import_nothing_above():
    for path in (SRC / "backends").rglob("*.py"):
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] == "tilesplat" and len(parts) > 1:
                assert parts[1] in ("backends", "constants"), f"{path}:{line} imports {name}"


def test_train_and_bench_point_one_way():
    """bench replays the trainer's step (bench → train, bench/replay.py); train never imports
    bench, and cli/gate.py reaches the gate through bench/gate.py."""
    for path in (SRC / "train").rglob("*.py"):
        for line, name in _imports(path):
            assert not name.startswith("tilesplat.bench"), f"{path}:{line} imports {name}"
    replay = {name for _, name in _imports(SRC / "bench" / "replay.py")}
    assert "tilesplat.train.step.optimization" in replay


# The rooms of the trainer, top to bottom (docs/architecture.md): a room imports only the rooms
# below it and the trainer's base modules (config, seams, recipes), which import no room.
TRAIN_ROOMS = {"loop": 5, "rundir": 4, "step": 3, "features": 2, "models": 1, "parallel": 0}
TRAIN_BASE = ("config", "seams", "recipes")


def _train_room(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["tilesplat", "train"] else None


def test_train_rooms_point_down():
    problems = []
    for path in sorted((SRC / "train").rglob("*.py")):
        rel = path.relative_to(SRC / "train").parts
        here = rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")
        for line, name in _imports(path):
            there = _train_room(name)
            if there is None or there == here or here == "__init__":
                continue
            if here in TRAIN_BASE and there in TRAIN_ROOMS:
                problems.append(f"train/{'/'.join(rel)}:{line} (a base module) imports {name}")
            elif there in TRAIN_ROOMS and TRAIN_ROOMS[there] > TRAIN_ROOMS.get(here, 99):
                problems.append(f"train/{'/'.join(rel)}:{line} ({here}) imports {name}")
    assert not problems, "imports pointing up the trainer's rooms:\n" + "\n".join(problems)


def _modules() -> dict[str, Path]:
    """Every module of tilesplat by dotted name (a package by its ``__init__``)."""
    mods = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("").parts
        mods[".".join(["tilesplat", *(rel[:-1] if rel[-1] == "__init__" else rel)])] = path
    return mods


def _module_graph(package: str = "") -> dict[str, set[str]]:
    """Imports between the modules of ``tilesplat.<package>`` (all of tilesplat when empty),
    lazy imports inside functions and imports for type checking included: an edge is any
    import statement, wherever it stands. ``from X import y`` is an edge to ``X.y`` when that
    is a module, else to ``X``; a module's import of its own package is not an edge."""
    prefix = "tilesplat" + (f".{package}" if package else "")
    mods = {m: p for m, p in _modules().items() if m == prefix or m.startswith(prefix + ".")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for _, name in _imports(path):
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                graph[mod].add(name)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere():
    """No circle among all of tilesplat's modules (issue 22 removed the last three: the
    bench's tolerances and its ``run:`` dispatch, the io helpers and the suffix table, the
    config and the variants it validates)."""
    graph = _module_graph()
    assert {"tilesplat.train.config", "tilesplat.data.sfm.pipeline", "tilesplat.io.ply"} <= (
        graph.keys()
    )
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_circle_finder_finds_circles():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_only_cli_imports_cli():
    """The command line sits on top: no other module imports ``tilesplat.cli``."""
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).parts[0] == "cli":
            continue
        for line, name in _imports(path):
            assert not name.startswith("tilesplat.cli"), f"{path}:{line} imports {name}"


def test_import_tilesplat_touches_no_cli_module():
    """``import tilesplat`` loads no module of the CLI (its environment defaults live in the
    standard-library module ``command_env``)."""
    code = ("import sys, tilesplat; "
            "print(sorted(m for m in sys.modules if m.startswith('tilesplat.cli')))")
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_command_env_uses_only_the_standard_library():
    for _, name in _imports(SRC / "command_env.py"):
        assert name.split(".")[0] in sys.stdlib_module_names, name


def test_pycolmap_only_inside_functions():
    """pycolmap is the optional extra [sfm]: no module imports it at import time."""
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "pycolmap" for n in names), f"{path}:{node.lineno}"


def test_viewer_stands_apart():
    """The viewer reads no run folders itself (the CLI hands it Gaussians), so it imports
    neither train nor bench; train reaches it only through the live view the trainer opens
    when ``viewer_port`` is set, and viser only inside functions."""
    for path in (SRC / "viewer").rglob("*.py"):
        for line, name in _imports(path):
            assert not name.startswith(("tilesplat.train", "tilesplat.bench", "tilesplat.cli")), (
                f"{path}:{line} imports {name}"
            )
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level: no viser
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                assert not any(m.split(".")[0] == "viser" for m in mods), f"{path} imports viser"
    for path in (SRC / "train").rglob("*.py"):
        for line, name in _imports(path):
            if name.startswith("tilesplat.viewer"):
                assert path.name == "trainer.py" and name == "tilesplat.viewer.live", (
                    f"{path}:{line} imports {name}"
                )
