"""The four layers import only downward, ``state`` knows no Kafka client, and no module
imports another that imports it back (docs/ARCHITECTURE.md draws the layers).

core (``kafka_changelog/*.py``, ``memory/``) < state (``kafka_changelog/state/``) <
kafka (``kafka_changelog/kafka/``) < spark (``spark_integration/``). The tools (the
command line, ``kafka_changelog/cli/``, and the local Kafka it runs,
``kafka_changelog/local_kafka/``) are applications of the library beside spark: they
may use every layer below, never spark. So may the test kit
(``kafka_changelog/testing/``), which the library, spark and the tools never import.

Inside state, the sub-packages stand in floors (``STATE_FLOORS``, drawn in
docs/ARCHITECTURE.md): each imports only floors below its own, so two on one floor
never import each other. The modules at the root of ``kafka_changelog/state/``
(errors, records) are the ground floor; its ``__init__`` hands the public names on.

Inside spark, one package per role: the reader (``spark_integration/reader/``) and
streaming (``spark_integration/streaming/``) never import each other; both may use
sessions (``spark_integration/sessions/``) and the modules both sides hold to, at the top
of the package (``keys.py``, ``checkpoint_properties.py``); those import no package of
spark, and only the package's face (``spark_integration/__init__.py``) imports them all.
The state writer (``spark_integration/writer/``) is the reader's data source with writes
added: it may import the reader, never the reverse.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"core": 0, "state": 1, "kafka": 2, "tools": 3, "spark": 3, "test kit": 3}
# Sideways reaches that are refused: the tools never import spark, and neither they nor
# spark import the test kit.
FORBIDDEN = {("tools", "spark"), ("test kit", "spark"), ("tools", "test kit"),
             ("spark", "test kit")}


#: The sub-packages of ``kafka_changelog/state/``, bottom up: what a state is and its bytes;
#: the working copy; RocksDB, time and snapshots over it; what a checkpoint records; the
#: backends; host-local state and the checkpoint history, which use the backends.
STATE_FLOORS = {"schema": 1, "tables": 2, "rocksdb": 3, "time": 3, "snapshots": 3,
                "checkpoints": 4, "backend": 5, "host": 6, "history": 6}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "spark_integration":
        return "spark"
    if len(parts) == 1:
        return "core"
    second = parts[1]
    if second in ("state", "kafka"):
        return second
    if second in ("cli", "local_kafka"):
        return "tools"
    if second == "testing":
        return "test kit"
    return "core"  # kafka_changelog.<module> and kafka_changelog.memory


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of the project."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, top_level_only: bool) -> list[tuple[int, str]]:
    """(line, imported module) of a file: absolute names, relative ones resolved; a module
    imported from its package (``from . import handles``) is that module."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found += [(node.lineno, f"{target}.{alias.name}" if is_module(f"{target}.{alias.name}")
                       else target) for alias in node.names]
    return found


def library_files() -> list[Path]:
    return sorted(p for package in ("kafka_changelog", "spark_integration")
                  for p in (ROOT / package).rglob("*.py"))


def test_layers_import_only_downward() -> None:
    wrong = []
    for path in library_files():
        mine = layer_of(module_name(path))
        for line, target in imports_of(path, top_level_only=False):
            if not target.startswith(("kafka_changelog", "spark_integration")):
                continue
            theirs = layer_of(target)
            if LAYERS[theirs] > LAYERS[mine] or (mine, theirs) in FORBIDDEN:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({mine}) imports {target} "
                             f"({theirs})")
    assert wrong == []


def test_state_imports_no_kafka_client() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}"
             for path in (ROOT / "kafka_changelog" / "state").rglob("*.py")
             for line, target in imports_of(path, top_level_only=False)
             if target.split(".")[0] == "confluent_kafka"]
    assert wrong == []


def test_no_import_cycles() -> None:
    modules = {module_name(p): p for p in library_files()}
    graph = {name: {t for _, t in imports_of(path, top_level_only=True) if t in modules}
             for name, path in modules.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def state_part(module: str) -> str | None:
    """The state sub-package of ``module`` (``""``: a module at the root of state, the
    ground floor); None outside state and for the package's own ``__init__``."""
    parts = module.split(".")
    if parts[:2] != ["kafka_changelog", "state"] or len(parts) == 2:
        return None
    return parts[2] if parts[2] in STATE_FLOORS else ""


def state_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importing part, imported part) of every import between state's parts
    (``"__init__"``: the package's face, above every floor)."""
    found = []
    for path in sorted((ROOT / "kafka_changelog" / "state").rglob("*.py")):
        mine = state_part(module_name(path))
        if mine is None:
            continue
        for line, target in imports_of(path, top_level_only=False):
            theirs = "__init__" if target == "kafka_changelog.state" else state_part(target)
            if theirs is not None and theirs != mine:
                found.append((str(path.relative_to(ROOT)), line, mine, theirs))
    return found


def test_every_state_module_is_in_a_part_of_known_floor() -> None:
    """A new sub-package of state must be given its floor here."""
    state = ROOT / "kafka_changelog" / "state"
    folders = {p.parent.name for p in state.glob("*/*.py")}
    assert folders == set(STATE_FLOORS)
    assert all((state / name / "__init__.py").is_file() for name in STATE_FLOORS)


def test_state_sub_packages_import_only_lower_floors() -> None:
    floor = {"": 0, **STATE_FLOORS, "__init__": max(STATE_FLOORS.values()) + 1}
    wrong = [f"{path}:{line} ({mine}, floor {floor[mine]}) imports {theirs} "
             f"(floor {floor[theirs]})"
             for path, line, mine, theirs in state_imports() if floor[theirs] >= floor[mine]]
    assert wrong == []


def test_state_sub_packages_form_no_circle() -> None:
    """No circle between the parts, whatever the floors say (a change of the floors must
    not let one in): a depth-first walk of the graph of parts finds no way back."""
    graph: dict[str, set[str]] = {}
    for _, _, mine, theirs in state_imports():
        graph.setdefault(mine, set()).add(theirs)
    circles = []
    done: set[str] = set()

    def visit(part: str, path: list[str]) -> None:
        for target in sorted(graph.get(part, ())):
            if target in path:
                circles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(part)

    for part in sorted(graph):
        visit(part, [part])
    assert circles == []


def test_state_sub_packages_only_describe_themselves() -> None:
    """A sub-package's ``__init__`` imports nothing: its modules are imported by their
    path, so importing one never drags in its neighbours (nor a circle)."""
    wrong = [f"{name}/__init__.py:{line} imports {target}"
             for name in STATE_FLOORS
             for line, target in imports_of(ROOT / "kafka_changelog" / "state" / name
                                            / "__init__.py", top_level_only=False)
             if target != "__future__"]
    assert wrong == []


SPARK_ROLES = ("reader", "streaming", "sessions", "writer")
#: The modules at the top of ``spark_integration`` besides its face: what the reader and
#: streaming both hold to. A new one is placed here on purpose, or goes in a role's package.
SPARK_SHARED = ("spark_integration.keys", "spark_integration.checkpoint_properties")
#: What each part of spark may import of spark, besides itself.
SPARK_MAY_IMPORT = {
    "face": {"reader", "streaming", "sessions", "writer", "shared"},
    "reader": {"sessions", "shared"},
    # The state writer is the reader's data source with writes added.
    "writer": {"reader", "sessions", "shared"},
    "streaming": {"sessions", "shared"},
    "sessions": set(),
    "shared": set(),
}


def spark_part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "face"
    if parts[1] in SPARK_ROLES:
        return parts[1]
    assert ".".join(parts[:2]) in SPARK_SHARED, f"{module}: in no role's package"
    return "shared"


def test_spark_roles_import_only_what_they_may() -> None:
    wrong = []
    for path in sorted((ROOT / "spark_integration").rglob("*.py")):
        mine = spark_part(module_name(path))
        for line, target in imports_of(path, top_level_only=False):
            if target.split(".")[0] != "spark_integration":
                continue
            theirs = spark_part(target)
            if theirs != mine and theirs not in SPARK_MAY_IMPORT[mine]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({mine}) imports {target} "
                             f"({theirs})")
    assert wrong == []


def test_the_library_imports_nothing_outside_the_package() -> None:
    """The wheel holds kafka_changelog and spark_integration only: examples, benchmarks
    and tests run from the repository root, and the library never imports them."""
    outside = ("examples", "benchmarks", "tests")
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}"
             for path in library_files()
             for line, target in imports_of(path, top_level_only=False)
             if target.split(".")[0] in outside]
    assert wrong == []
