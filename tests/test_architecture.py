"""The rules of the house (docs/architecture.md), read off the source: no import cycle between the
package's modules, and the arrows between rooms point one way."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = "hf_pretrain"
# publish/space_template/app.py runs in a Space without hf-pretrain: it is data to the package.
NOT_MODULES = {f"{PACKAGE}.publish.space_template.app"}


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
MODULES = {name: path for name, path in MODULES.items() if name not in NOT_MODULES}


def _is_type_checking(node: ast.If) -> bool:
    return (
        isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _import_nodes(tree: ast.Module, module_level_only: bool):
    """Import statements; with `module_level_only`, those that run when the module is imported
    (not inside functions or classes, not under `if TYPE_CHECKING:`)."""
    if not module_level_only:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        return
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, ast.With):
            pending += node.body


def imported_modules(module: str, module_level_only: bool = False) -> set[str]:
    """The package modules `module` imports: `from a.b import c` names a.b.c when that is a module.
    Importing a.b.c first runs the __init__ of each package above it that `module` is not inside."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text()), module_level_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the package `level - 1` steps up
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            if not target.startswith(PACKAGE + ".") and target != PACKAGE:
                continue
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                ancestor = ".".join(parts[:depth])
                inside = module == ancestor or module.startswith(ancestor + ".")
                if ancestor in MODULES and ancestor != module and (depth == len(parts) or not inside):
                    found.add(ancestor)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_not_even_through_lazy_or_type_only_imports():
    """A lazy import (inside a function) or one under TYPE_CHECKING hides a circle from Python, not from a reader."""
    graph = {module: imported_modules(module) for module in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_test_sees_lazy_and_type_only_imports(tmp_path, monkeypatch):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from hf_pretrain.b import x\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hf_pretrain.a import y\n")
    monkeypatch.setitem(MODULES, "hf_pretrain.a", a)
    monkeypatch.setitem(MODULES, "hf_pretrain.b", b)
    assert imported_modules("hf_pretrain.a") == {"hf_pretrain.b"} and imported_modules("hf_pretrain.b") == {
        "hf_pretrain.a"
    }


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _room(module: str) -> list[str]:
    return [m for m in MODULES if m == module or m.startswith(module + ".")]


BELOW_THE_MACHINE = [
    f"{PACKAGE}.{room}"
    for room in (
        "economics",
        "training",
        "checkpoints",
        "preflight",
        "data",
        "store",
        "publish",
        "evaluation",
        "bench",
        "check",
        "run_folder",
        "optim",
        "run_commands",
        "train",
    )
]


@pytest.mark.parametrize(
    "room, forbidden",
    [
        ("hf_pretrain.training", ["hf_pretrain.publish", "hf_pretrain.evaluation"]),  # only through callbacks
        ("hf_pretrain.data", ["hf_pretrain.training"]),  # data and model know nothing of the loop
        ("hf_pretrain.model.llama", ["hf_pretrain.training"]),
        ("hf_pretrain.optim.build", ["hf_pretrain.training"]),
        # the checkpoint room sits below everything that reads or writes checkpoints
        (
            "hf_pretrain.checkpoints",
            ["hf_pretrain.training", "hf_pretrain.publish", "hf_pretrain.evaluation", "hf_pretrain.preflight"],
        ),
        # ... and below the data and the model: a start's resume decision is handed the data's identity, the shape
        # checks ask the model section (config/) (issue 46), so the
        # store's run half (store/run/) may read checkpoints while the data reads its half (store/data/), with no
        # loop between rooms
        (
            "hf_pretrain.checkpoints",
            [
                "hf_pretrain.data",
                "hf_pretrain.store",
                "hf_pretrain.store.data",
                "hf_pretrain.store.run",
                "hf_pretrain.model.llama",
            ],
        ),
        # the store's two halves (issue 46): the data half knows nothing of runs or checkpoints (the shared base
        # at the wing's root knows neither half: test_the_stores_shared_base_knows_neither_half)
        ("hf_pretrain.store.data", ["hf_pretrain.store.run", "hf_pretrain.checkpoints", "hf_pretrain.data"]),
        # publishing, evaluation and the preflight read checkpoints through the room, never the loop's
        ("hf_pretrain.publish", ["hf_pretrain.training"]),
        ("hf_pretrain.evaluation", ["hf_pretrain.training"]),
        ("hf_pretrain.preflight", ["hf_pretrain.training"]),
        ("hf_pretrain.model.initialisation", ["hf_pretrain.training"]),
        ("hf_pretrain.model.fp8", ["hf_pretrain.training"]),  # an ingredient: the preflight asks it too
        # the products: evaluation fills model cards (publish/model_card.py); publishing starts the benchmark
        # job as a process (evaluation/score_checkpoint.py) and never imports evaluation
        ("hf_pretrain.publish", ["hf_pretrain.evaluation"]),
        # what a device measures knows nothing of GPU prices or tables: the run profile asks machine/gpus.py
        ("hf_pretrain.machine.hardware", ["hf_pretrain.economics", "hf_pretrain.machine.run_profile"]),
        # the stop story: the request file is a shared fact the run, the doctor and the command read; the
        # command is a product the run never imports (a request found at a start is the guards')
        (
            "hf_pretrain.run_folder.stop_request",
            ["hf_pretrain.training", "hf_pretrain.preflight", "hf_pretrain.run_commands.stop_command"],
        ),
        # the run folder's facts are read by the checkpoints, the store and the commands: they read none of them
        (
            "hf_pretrain.run_folder",
            [
                "hf_pretrain.checkpoints",
                "hf_pretrain.store",
                "hf_pretrain.store.data",
                "hf_pretrain.store.run",
                "hf_pretrain.run_commands",
            ],
        ),
        ("hf_pretrain.training", ["hf_pretrain.run_commands.stop_command"]),
        ("hf_pretrain.preflight", ["hf_pretrain.run_commands.stop_command"]),
        # what a precision is: a shared fact every reader asks, below the run profile that resolves one
        (
            "hf_pretrain.machine.precisions",
            ["hf_pretrain.config", "hf_pretrain.machine.run_profile", "hf_pretrain.economics"],
        ),
        # the machine (issue 46): the GPU table, the precisions, the device's facts and the run profile sit
        # below every room that reads them; none of them reads back up
        ("hf_pretrain.machine", BELOW_THE_MACHINE),
        # a shared fact: data/ and model_init.py read Hub ids through it, it reads neither
        ("hf_pretrain.hub_cache", ["hf_pretrain.data", "hf_pretrain.model.llama", "hf_pretrain.model.initialisation"]),
    ],
)
def test_the_arrows_between_rooms_point_one_way(room, forbidden):
    assert _room(room), f"no module {room}"
    wrong = {
        f"{module} imports {target}"
        for module in _room(room)
        for target in imported_modules(module)  # lazy imports inside functions count too
        for prefix in forbidden
        if (target == prefix or target.startswith(prefix + "."))
        and not (target == room or target.startswith(room + "."))
    }
    assert not wrong, sorted(wrong)


STORE = f"{PACKAGE}.store"
STORE_HALVES = (f"{STORE}.run", f"{STORE}.data")


def test_the_store_is_one_wing_at_the_root():
    """Issue 58: the store is one folder at the package root, its shared base at the wing's root and the run
    and data halves inside, where three rooms stood beside each other (object_store/, run_store/, data_store/)."""
    rooms = {m.split(".")[1] for m in MODULES if m.count(".") >= 1}
    assert {"object_store", "run_store", "data_store"}.isdisjoint(rooms), rooms
    assert all(any(m == half or m.startswith(half + ".") for m in MODULES) for half in STORE_HALVES)
    assert sorted(room for room in rooms if "store" in room) == ["store"]


def test_the_stores_shared_base_knows_neither_half():
    """The way to talk to any store (the wing's own modules) knows neither half, nor the checkpoints or the data
    that sit above it."""
    base = [m for m in _room(STORE) if not any(m == h or m.startswith(h + ".") for h in STORE_HALVES)]
    forbidden = (*STORE_HALVES, f"{PACKAGE}.checkpoints", f"{PACKAGE}.data")
    wrong = {
        f"{module} imports {target}"
        for module in base
        for target in imported_modules(module)
        for prefix in forbidden
        if target == prefix or target.startswith(prefix + ".")
    }
    assert base and not wrong, sorted(wrong)


def _folder(module: str) -> str:
    """The room a module lives in: the folder under the package, or the loose module itself."""
    return ".".join(module.split(".")[:2])


def test_no_circle_between_rooms_at_folder_level():
    """Files may form no circle while their folders do (`checkpoints -> data -> object_store -> checkpoints`
    before the store's halves were split, issue 46): a reader sees rooms, so rooms hold the rule too."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        graph.setdefault(_folder(module), set()).update(
            _folder(target) for target in imported_modules(module) if _folder(target) not in (_folder(module), PACKAGE)
        )
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_config_is_a_leaf_reading_only_the_exit_codes():
    """config/ imports nothing of the package but exit_codes.py (the contract) and redaction.py (every
    recipe file it writes is redacted, issue 57), each of which imports nothing."""
    config, leaves = f"{PACKAGE}.config", (f"{PACKAGE}.exit_codes", f"{PACKAGE}.redaction")
    assert not any(imported_modules(leaf) for leaf in leaves)
    wrong = {
        f"{module} imports {target}"
        for module in _room(config)
        for target in imported_modules(module)
        if not target.startswith(config) and target not in leaves
    }
    assert not wrong, sorted(wrong)


def test_no_submodule_shadows_a_name_its_package_exports():
    """`from hf_pretrain.data import prepare` must give the function even after something imported
    the submodule of the same name (which rebinds the package attribute): no such pairs exist."""
    clashes = []
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        exported = {
            alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names
        }
        exported |= {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        clashes += [
            f"{module}.{name}"
            for name in exported
            if f"{module}.{name}" in MODULES and not _is_submodule_import(tree, module, name)
        ]
    assert not clashes, f"a module and a name exported by its package share a name: {clashes}"


def _is_submodule_import(tree: ast.Module, package: str, name: str) -> bool:
    """`from pkg import submodule` re-exports the module itself: that is no clash."""
    return any(
        isinstance(node, ast.ImportFrom) and node.module == package and any(a.name == name for a in node.names)
        for node in tree.body
    )


def test_no_two_modules_share_a_file_name():
    """A file name alone says where a thing happens: `report.py` is one module, not two."""
    by_name: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(module)
    shared = {name: modules for name, modules in by_name.items() if len(modules) > 1}
    assert not shared, shared


# lines: in the rooms that hold the run's state on disk (issue 33), and in `plan`, once a 99-line `make_plan` (issue 39)
LONGEST_FUNCTION = 70


def test_no_function_in_the_package_is_longer_than_a_screen():
    """A function reads in one screen (issue 39: 10 were over 70 lines); a longer one is split into
    named steps, as `loop.setup` into `checked_start` and `resumed_state`."""
    long = [
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for module in MODULES
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]
    assert not long, long


# How a run executes is decided once, in run_profile.py (the precision of `mixed_precision: auto`, the
# device, the card's facts); config/ defines the key, and the assets run inside lm-eval, not the package.
DEVICE_QUESTIONS = {"is_available", "is_bf16_supported", "get_device_capability", "get_device_name"}
PROFILE_HOME = {f"{PACKAGE}.machine.run_profile"}


def _decides_again(module: str) -> set[str]:
    """What `module` reads or asks that only the run profile may: `.mixed_precision`, torch's device."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "mixed_precision":
            found.add(f"{module}:{node.lineno} reads .mixed_precision")
        if isinstance(node, ast.Attribute) and node.attr in DEVICE_QUESTIONS:
            inner = node.value
            if isinstance(inner, ast.Attribute) and inner.attr in ("cuda", "mps"):  # torch.cuda.X, torch.backends.mps.X
                found.add(f"{module}:{node.lineno} asks torch.{inner.attr}.{node.attr}")
    return found


def test_only_the_run_profile_resolves_the_precision_and_asks_torch_for_the_device():
    exempt = PROFILE_HOME | set(_room(f"{PACKAGE}.config")) | set(_room(f"{PACKAGE}.evaluation.assets"))
    wrong = sorted(line for module in MODULES if module not in exempt for line in _decides_again(module))
    assert not wrong, wrong


def test_the_profile_check_sees_a_module_that_decides_again(tmp_path, monkeypatch):
    source = tmp_path / "again.py"
    source.write_text("import torch\nx = torch.cuda.is_available() and recipe.compute.mixed_precision\n")
    monkeypatch.setitem(MODULES, "again", source)
    assert len(_decides_again("again")) == 2


def test_no_package_hides_its_names_behind_a_lazy_facade():
    """Issue 46: a package `__getattr__` that loaded names on first use kept `--help` free of torch but hid
    the preflight from a reader following the imports; each name is imported from where it lives."""
    facades = [
        module
        for module, path in MODULES.items()
        if path.name == "__init__.py"
        and any(
            isinstance(node, (ast.FunctionDef, ast.Assign))
            and "__getattr__"
            in ([node.name] if isinstance(node, ast.FunctionDef) else [ast.unparse(t) for t in node.targets])
            for node in ast.parse(path.read_text()).body
        )
    ]
    assert not facades, facades


# Issue 46: which machine this is (`this_machine()`, `device_kind()`) is asked at a command's door, and the
# answer handed down: a `RunProfile` (economics/resolved_run.complete_profile), or its `Machine`. Nothing
# below a door asks again. A what-if for a named card (machine/what_if.py's `profile_on(written, "H100")`:
# `plan`, the memory estimate, the performance model) is modelling, not asking; `run_profile` has no default
# machine.
ASKS_WHICH_MACHINE = {"this_machine", "device_kind"}
# module -> the functions a command, or a process of one, enters by: the only places that may ask
DOORS = {
    "training.loop": {"setup"},  # `train`: each rank, once PartialState has given it its GPU
    "preflight.doctor": {"main"},  # `doctor`
    "bench.sweep": {"run_bench"},  # `bench`: CUDA left untouched while its children run, then the card
    "bench.variants": {"run_in_this_process"},  # one bench variant, a process of its own
    "check.command": {"main"},  # `check`: its parts run in processes of their own
    "check.worker": {"main"},  # one part of the check, a process of its own
    "evaluation.harness": {"run", "evaluate_checkpoint"},  # `eval`; the benchmark side job's own process
}


def machine_questions(module: str) -> set[str]:
    """The functions of `module` (top level, or `Class.method`) that ask which machine this is."""
    units = []  # (name, node): each top-level function, each method, the rest of the module
    for node in ast.parse(MODULES[module].read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            units.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            units += [(f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, ast.FunctionDef)]
        else:
            units.append(("<module>", node))
    return {
        name
        for name, unit in units
        for call in ast.walk(unit)
        if isinstance(call, ast.Call)
        and (getattr(call.func, "id", None) or getattr(call.func, "attr", None)) in ASKS_WHICH_MACHINE
    }


def test_only_a_commands_door_asks_which_machine_this_is():
    import inspect

    from hf_pretrain.machine.run_profile import run_profile

    asked = {
        (module, where)
        for module in MODULES
        if not module.startswith(f"{PACKAGE}.machine.")
        for where in machine_questions(module)
    }
    doors = {(f"{PACKAGE}.{module}", name) for module, names in DOORS.items() for name in names}
    assert asked <= doors, f"hand these the door's profile (or its machine) instead: {sorted(asked - doors)}"
    assert asked == doors, f"no longer asks: leave DOORS: {sorted(doors - asked)}"
    # a profile always names its machine: no default that would ask on the quiet, below a door
    assert inspect.signature(run_profile).parameters["machine"].default is inspect.Parameter.empty
    # `attention_backend: auto` is resolved in one place, into the profile (economics/resolved_run.complete_profile)
    resolving = {
        module
        for module in MODULES
        if any(
            isinstance(node, ast.Call) and getattr(node.func, "id", None) == "resolved_attention_backend"
            for node in ast.walk(ast.parse(MODULES[module].read_text()))
        )
    }
    assert resolving == {f"{PACKAGE}.economics.resolved_run"}, resolving


def test_the_door_check_sees_a_function_below_a_door_that_asks(tmp_path, monkeypatch):
    source = tmp_path / "below.py"
    source.write_text(
        "def door():\n    return this_machine()\n\n"
        "class Part:\n    def measure(self):\n        return run_profile.device_kind() == 'cuda'\n"
    )
    monkeypatch.setitem(MODULES, "below", source)
    assert machine_questions("below") == {"door", "Part.measure"}


# Issue 58, no card nobody chose: a run's records, the bench and the check's verdict are priced and keyed on the
# door's profile (the machine it is on, the card its parts measured), and a what-if on another card names it
# through machine/what_if.py (`profile_on`, `profile_on_any_card`): before, `A_GPU`, the default `machine` of the
# memory estimate, the workload and the measurement key, stood in at 16 call sites in 9 files.
MACHINE_TYPES = {"Machine", "RunProfile", "Step", "GPU"}
# The modules outside machine/ that build a profile with `run_profile(` themselves: the door's builder
# (economics/resolved_run.complete_profile) alone. A ratchet: 10 modules before issue 58, never more than this.
PROFILE_BUILDERS = {f"{PACKAGE}.economics.resolved_run"}


def default_cards(path: Path) -> list[str]:
    """A card nobody chose in `path`: a name `A_GPU`, or a parameter annotated as a machine, a profile, a step
    or a GPU with a default other than None (`machine: Machine = THE_CPU`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id == "A_GPU":
            found.append(f"{node.lineno}: A_GPU")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            found += [
                f"{node.lineno}: {node.name}({a.arg}={ast.unparse(d)})"
                for a, d in pairs
                if MACHINE_TYPES & _annotation_names(a.annotation)
                and not (isinstance(d, ast.Constant) and d.value is None)
            ]
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def _annotation_names(annotation: ast.expr | None) -> set[str]:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # "GPU | None", a string annotation
        annotation = ast.parse(annotation.value, mode="eval").body
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} if annotation is not None else set()


def test_no_default_card_anywhere():
    wrong = {module: found for module, path in MODULES.items() if (found := default_cards(path))}
    assert not wrong, f"name the card (machine/what_if.py) or hand down the door's: {wrong}"


def test_the_default_card_check_sees_one(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "A = A_GPU\ndef f(recipe, machine: Machine = THE_CPU): ...\ndef g(*, on: 'GPU | None' = card()): ...\n"
        "def h(machine: Machine | None = None, n: int = 1): ...\n"
    )
    assert [line.split(":")[0] for line in default_cards(source)] == ["1", "2", "3"]


def builds_a_profile(path: Path) -> bool:
    return any(
        isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "run_profile"
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_only_the_door_and_the_what_if_builder_build_a_profile():
    builders = {m for m, path in MODULES.items() if not m.startswith(f"{PACKAGE}.machine.") and builds_a_profile(path)}
    assert builders <= PROFILE_BUILDERS, (
        f"ask the door's profile (economics/resolved_run.complete_profile) or a what-if (machine/what_if.py): "
        f"{sorted(builders - PROFILE_BUILDERS)}"
    )
    assert len(PROFILE_BUILDERS) <= 1


def test_the_economics_take_a_step_not_a_recipe():
    """The measurement key and the workload are of a model, a step and a batch: no recipe (and so no card
    assumed to resolve one) is handed to them; `recipe_workload`, which took one, is gone."""
    import inspect

    from hf_pretrain.economics import measurements, workload

    for function in (measurements.configuration, workload.run_workload, workload.workload):
        annotations = {p.annotation for p in inspect.signature(function).parameters.values()}
        assert not any("Recipe" in str(a) for a in annotations), function.__name__
        assert "Step" in {str(a) for a in annotations}, function.__name__
    assert not hasattr(workload, "recipe_workload")


def test_the_any_card_what_if_is_the_step_of_every_card_of_the_table():
    """`profile_on_any_card` leaves the card out because the step resolves alike on each card of the table."""
    from hf_pretrain.config import load_recipe
    from hf_pretrain.machine.gpus import gpu_table
    from hf_pretrain.machine.what_if import profile_on, profile_on_any_card

    for flags in ({}, {"liger": True}, {"mixed_precision": "fp8"}, {"mixed_precision": "no"}):
        recipe = load_recipe("1b", flags)
        steps = {profile_on(recipe.step_as_written, gpu).step for gpu in gpu_table().values()}
        assert steps == {profile_on_any_card(recipe.step_as_written).step}, flags


# Issue 46, "is this a URL?" asked once: where the run and the data live (a local folder or a store URL) is
# decided at a command's door (`Location.of`, `Where.of`, store/location.py) and handed down, as the run
# profile is. The modules allowed to ask: the doors, and a ratchet of those that still ask below one (it may
# shrink, never grow).
WHERE_QUESTIONS = {"is_url"}  # and `Location.of(...)` / `Where.of(...)`, the typed way to ask
WHERE_HOME = {f"{PACKAGE}.store.urls", f"{PACKAGE}.store.location"}
WHERE_DOORS = {
    f"{PACKAGE}.{name}"
    for name in (
        "train preflight.doctor run_commands.run_status run_commands.stop_command publish.export "
        "publish.demo_command publish.gguf evaluation.eval_command run_commands.report data.prepare_command check.worker "
        "bench.bench_command"
    ).split()
}
ASKS_BELOW_A_DOOR = {
    f"{PACKAGE}.{name}"
    for name in (
        # a data_dir read from a run's own record in the store enters there, not at a door
        "store.run.run_record"
    ).split()
}


def _asks_where_it_is(module: str) -> int:
    """How many times `module` asks whether a location is a URL."""
    return sum(
        isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id in WHERE_QUESTIONS)
            or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "of"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("Location", "Where")
            )
        )
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
    )


def test_only_the_doors_ask_whether_a_location_is_a_url():
    askers = {module for module in MODULES if module not in WHERE_HOME and _asks_where_it_is(module)}
    assert askers <= WHERE_DOORS | ASKS_BELOW_A_DOOR, (
        f"hand these the door's Location/Where instead: {askers - WHERE_DOORS - ASKS_BELOW_A_DOOR}"
    )
    assert not ASKS_BELOW_A_DOOR - askers, f"no longer asks: remove from the list {ASKS_BELOW_A_DOOR - askers}"


def test_the_where_check_sees_a_module_that_asks(tmp_path, monkeypatch):
    module = tmp_path / "m.py"
    module.write_text("def f(x):\n    return is_url(x) or Location.of(x).in_store or Where.of(x)\n")
    monkeypatch.setitem(MODULES, "hf_pretrain.m", module)
    assert _asks_where_it_is("hf_pretrain.m") == 3


# Issue 58, the local copy is the store room's business alone: a URL's working copy in the cache is derived in
# the store wing (`Location.local`, store/location.py, by store/cache.py's rule), from the cache folder the door
# read once (`Where.of`); the loop, the checkpointer and the preflight read it off the door's `Where`. No module
# outside the wing works a copy out (`working_copy(`, `local_copy(`): 3 modules at 16beb72 (train, preflight.checks,
# preflight.store_access; disk.py only had `is_working_copy(`, which this count does not match), 0 now.
COPY_DERIVERS = {"working_copy", "local_copy"}
# ...and the cache folder (`store.cache_dir`) is read in ever fewer modules: a ratchet, it may shrink, never grow
# (10 modules read the attribute on 2026-12-04 before the door's `Where` carried it, 7 after; 3 on 2026-12-05, after
# the data room, the data's upload and the run's sync took the door's `Location`; 2 once the bench line's copy was
# named by its URL where every preflight row's is, `checks._named_as_given`); 1 once the demo's own --cache_dir (its
# folder of exports, not the store's cache) was parsed into `export_folder`.
READS_CACHE_DIR = {
    f"{PACKAGE}.store.location"
}  # the home: `Where.of` reads it once for the run's and the data's copies


def _calls_named(module: str, names: set[str]) -> int:
    """How many calls in `module` are to a function (or method) named one of `names`."""
    return sum(
        isinstance(node, ast.Call)
        and ((node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)) in names)
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
    )


def _reads_cache_dir(module: str) -> bool:
    tree = ast.parse(MODULES[module].read_text())
    return any(isinstance(node, ast.Attribute) and node.attr == "cache_dir" for node in ast.walk(tree))


def test_only_the_store_wing_works_out_a_local_copy():
    outside = {m for m in MODULES if not m.startswith(f"{STORE}.") and _calls_named(m, COPY_DERIVERS)}
    assert not outside, f"read the copy off the door's Where/Location (`.local`) instead: {sorted(outside)}"


def test_the_cache_folder_is_read_in_fewer_modules_never_more():
    readers = {module for module in MODULES if _reads_cache_dir(module)}
    assert readers <= READS_CACHE_DIR, f"hand these the door's Where/Location instead: {readers - READS_CACHE_DIR}"
    assert not READS_CACHE_DIR - readers, f"no longer reads it: remove from the list {READS_CACHE_DIR - readers}"


def test_the_copy_and_cache_checks_see_every_spelling(tmp_path, monkeypatch):
    module = tmp_path / "m.py"
    module.write_text("def f(r, s):\n    return working_copy(r, s.cache_dir), cache.local_copy(r, 'runs')\n")
    monkeypatch.setitem(MODULES, "hf_pretrain.m", module)
    assert _calls_named("hf_pretrain.m", COPY_DERIVERS) == 2
    assert _reads_cache_dir("hf_pretrain.m")


# Issue 58, what a scheme is has one home: its row of store/schemes.py (client options, fix lines, the lease's
# conditional write, the credentials redaction.py masks), as a precision's is its row of machine/precisions.py.
# Nowhere else does a module compare a scheme with its word (`url.scheme == "s3"`, `in ("s3", "gs")`): it asks
# the row. SCHEME_WORDS_COMPARED is the ratchet of those that still do; it may shrink, never grow.
SCHEME_WORDS = {"s3", "gs", "hf", "gcs"}
SCHEME_HOME = f"{PACKAGE}.store.schemes"
SCHEME_WORDS_COMPARED: set[str] = set()


def _literal_words(node: ast.expr) -> set[str]:
    """The strings `node` spells out: a literal, or the literals of a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {word for element in node.elts for word in _literal_words(element)}
    return set()


def compares_a_scheme(path: Path) -> list[int]:
    """The lines of `path` where a value is compared (==, !=, in, not in) with a scheme's word."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops)
        and any(_literal_words(side) & SCHEME_WORDS for side in (node.left, *node.comparators))
    ]


def test_only_the_scheme_table_compares_a_scheme_with_its_word():
    comparing = {module for module, path in MODULES.items() if module != SCHEME_HOME and compares_a_scheme(path)}
    assert comparing <= SCHEME_WORDS_COMPARED, (
        f"ask the scheme's row (store/schemes.py) instead: "
        f"{ {m: compares_a_scheme(MODULES[m]) for m in comparing - SCHEME_WORDS_COMPARED} }"
    )
    assert not SCHEME_WORDS_COMPARED - comparing, f"no longer compares: remove {SCHEME_WORDS_COMPARED - comparing}"


def test_the_scheme_check_sees_every_spelling(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f(url, s):\n    a = url.scheme == 's3'\n    b = 'hf' != s\n    c = s in ('gs', 'x')\n"
        "    d = s not in {'gcs'}\n    e = s == 'http'\n"
    )
    assert compares_a_scheme(module) == [2, 3, 4, 5]


# Issue 46, components built from their own section: a function handed the whole `Recipe` reads everything, so
# a reader cannot tell what it depends on. The count may fall, never rise (195 when the issue was filed; 147 on
# 2026-11-28, then 74; 73 with issue 58): a new function takes the section it reads, with its runtime needs by keyword.
# A parameter named `recipe` without an annotation counts too (issue 58's rule: 77 on 2026-12-05 with them; 69 after
# the data room took the door's Location and the bench's and the check's verdict their sections; 68 once the model, the
# optimizer and the attention kernel's resolution took theirs; 45 once a run profile took the step as the recipe writes
# it, `StepAsWritten`, and the GPU rows, the memory, liger, store and resume rows, the card and the state theirs; 39
# once the check's synthetic step took the worker's profile and its sections, and the bench's runner its recipe).
MOST_FUNCTIONS_HANDED_THE_RECIPE = 39


def _annotation_names_recipe(annotation: ast.expr | None) -> bool:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # "Recipe", a string annotation
        annotation = ast.parse(annotation.value, mode="eval").body
    return annotation is not None and any(isinstance(n, ast.Name) and n.id == "Recipe" for n in ast.walk(annotation))


def functions_handed_the_recipe(path: Path) -> list[str]:
    """The functions of `path` with a parameter annotated `Recipe` (`"Recipe"`, `Recipe | None` too), or named
    `recipe` with no annotation."""
    handed = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
            if any(
                _annotation_names_recipe(p.annotation) or (p.annotation is None and p.arg == "recipe") for p in params
            ):
                handed.append(node.name)
    return handed


def test_fewer_functions_are_handed_the_whole_recipe_never_more():
    handed = [f"{module}.{name}" for module, path in MODULES.items() for name in functions_handed_the_recipe(path)]
    assert len(handed) <= MOST_FUNCTIONS_HANDED_THE_RECIPE, (
        f"{len(handed)} functions take the whole Recipe (at most {MOST_FUNCTIONS_HANDED_THE_RECIPE}): hand the new "
        "ones the section they read"
    )


def test_the_recipe_count_sees_every_spelling(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def a(recipe: Recipe): ...\ndef b(x, *, r: 'Recipe'): ...\n"
        "def c(r: Recipe | None = None): ...\ndef d(data: DataConfig): ...\n"
        "def e(recipe, x): ...\ndef f(recipe: DataConfig): ...\n"
    )
    assert functions_handed_the_recipe(source) == ["a", "b", "c", "e"]


# Issue 58: one Accelerator builder (training/accelerator.py), used by training and by the pod check's
# synthetic step, so the check times the step training runs: its kernel, precision, compile and FP8 settings.
ACCELERATOR_BUILDER = f"{PACKAGE}.training.accelerator"


def accelerator_constructions(module: str) -> list[int]:
    """The lines of `module` that call something named `Accelerator` (`Accelerator(...)`, `accelerate.Accelerator(...)`)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "Accelerator"
    ]


def test_one_accelerator_construction_in_the_package():
    built = {module: lines for module in MODULES if (lines := accelerator_constructions(module))}
    assert list(built) == [ACCELERATOR_BUILDER] and len(built[ACCELERATOR_BUILDER]) == 1, (
        f"build the Accelerator through training/accelerator.py's accelerator_for: {built}"
    )


def test_the_accelerator_count_sees_every_spelling(tmp_path, monkeypatch):
    source = tmp_path / "m.py"
    source.write_text(
        "import accelerate\na = Accelerator(cpu=True)\nb = accelerate.Accelerator()\nc = PartialState()\n"
    )
    monkeypatch.setitem(MODULES, "hf_pretrain.m", source)
    assert accelerator_constructions("hf_pretrain.m") == [2, 3]


# The layer diagram of docs/architecture.md ("The arrows") is the code's: each line's rooms (folders and loose
# modules, written `data/` or `cli.py`, before any note in parentheses) import only rooms on lines below.
DIAGRAM_ROOM = re.compile(r"(?<![\w/.-])([a-z_]+)(?:/|\.py)(?![\w/])")


def diagram_lines(text: str) -> list[list[str]]:
    """The rooms of each line of the page's first drawing under "## The arrows", top line first."""
    block = text.split("## The arrows", 1)[1].split("```", 2)[1]
    return [
        [f"{PACKAGE}.{name}" for name in DIAGRAM_ROOM.findall(line.split("(", 1)[0])]
        for line in block.splitlines()[1:]
        if line.strip()
    ]


def room_imports() -> dict[str, set[str]]:
    """Room -> the rooms it imports (every import, lazy and type-only ones too)."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        room = _folder(module)
        graph.setdefault(room, set()).update(_folder(t) for t in imported_modules(module) if _folder(t) != room)
    graph.pop(PACKAGE, None)
    return graph


def test_the_layer_diagram_is_the_codes():
    lines = diagram_lines((ROOT / "docs" / "architecture.md").read_text())
    height = {room: len(lines) - i for i, rooms in enumerate(lines) for room in rooms}
    graph = room_imports()
    assert set(height) == set(graph), (
        f"drawn, not rooms: {set(height) - set(graph)}; undrawn: {set(graph) - set(height)}"
    )
    upward = sorted(
        f"{room} imports {target}"
        for room, targets in graph.items()
        for target in targets - {PACKAGE}
        if height[target] >= height[room]
    )
    assert not upward, f"draw the importer above what it imports: {upward}"


def test_the_diagram_reader_reads_rooms_not_notes():
    text = "## The arrows\n\n```\nthe run   train.py   (-> training/loop)\n          data/  model/\n```\n"
    assert diagram_lines(text) == [["hf_pretrain.train"], ["hf_pretrain.data", "hf_pretrain.model"]]
