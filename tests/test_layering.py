"""Imports point down the layers of docs/architecture.md: cli → train/bench/viewer → data/io →
rendering → ops → backends. A test fails when an import points upward."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tilesplat"
LAYER = {
    "constants": -1,
    "assets": -1,
    "__version__": -1,
    "backends": 0,
    "ops": 1,
    "rendering": 2,
    "distributed": 2,
    "sharding": 2,
    "variants": 2,
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
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
            for name in names:
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
    assert "tilesplat.train.step" in replay


def _module_graph(package: str) -> dict[str, set[str]]:
    """Imports between the modules of ``tilesplat.<package>`` (lazy imports included)."""
    mods = {}
    for path in sorted((SRC / package).rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(["tilesplat", *(rel[:-1] if rel[-1] == "__init__" else rel)])
        mods[name] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for _, name in _imports(path):
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                graph[mod].add(name)
    return graph


def test_data_floor_has_no_import_cycle():
    """dataset.py imports the Blender and COLMAP loaders; they import frames.py, never it back
    (the circle that issue 12 removed). The SfM package and the room scene sit on the floor."""
    graph = _module_graph("data")
    assert {"tilesplat.data.sfm.pipeline", "tilesplat.data.room"} <= graph.keys()
    for start in graph:
        stack, seen = list(graph[start]), set()
        while stack:
            mod = stack.pop()
            assert mod != start, f"import cycle through {start}"
            if mod not in seen:
                seen.add(mod)
                stack.extend(graph.get(mod, ()))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as a path of modules back to its start, or None."""
    done: set[str] = set()

    def visit(mod: str, path: list[str]) -> list[str] | None:
        if mod in path:
            return path[path.index(mod):] + [mod]
        if mod in done:
            return None
        for dep in sorted(graph.get(mod, ())):
            found = visit(dep, [*path, mod])
            if found:
                return found
        done.add(mod)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_import_cycle_in_io_and_bench():
    """The suffix table imports the format modules, which import the shared checks, never it
    back; parity, the replay of a run and the gate share bench/tolerance.py, and the run:
    dispatch (bench/dispatch.py) is the only module that imports the replay."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    for package in ("io", "bench"):
        graph = _module_graph(package)
        assert len(graph) > 3, package
        cycle = _cycle(graph)
        assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


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
