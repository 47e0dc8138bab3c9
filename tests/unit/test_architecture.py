"""The package's layers, read from the source: imports go one way, none in a circle.

Every import counts, including those inside functions (they are how the heavy toolchains are
kept out of `doit list`, and they are where cycles used to hide). Only imports under
`if TYPE_CHECKING:` are left out: they never run.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipeline"

# Top to bottom: a package may import its own modules and those of any package below it.
LAYERS = [
    ("bench", "release", "diagnose"),  # commands beside the build: they read what the graph built
    ("graph",),             # the project and the one table of stages
    ("stages",),            # one module per doit stage
    ("compilers",),         # the backends (a compiler and its runners, one object each), thin tool
                            # wrappers (command lines) and the compilers' recorded facts
    ("run",),               # runners: IREE, TVM, onnxruntime, qemu, Vulkan, timing; the app-side runtime
    ("spec",),              # model.yaml and targets -> typed specs
    ("core",),              # errors, layout, store, tools, steps
]
RANK = {pkg: len(LAYERS) - i for i, names in enumerate(LAYERS) for pkg in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_block(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path) -> set[str]:
    """Modules of `pipeline` that `path` imports, anywhere in the file."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for block in ast.walk(tree) if _type_checking_block(block)
            for n in ast.walk(block)}
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("pipeline"):
                continue
            found.add(mod)  # the package itself: `from . import x` runs its __init__ first
            for alias in node.names:  # ... and imports the module x
                if (PIPELINE.parent / (mod.replace(".", "/") + f"/{alias.name}.py")).is_file():
                    found.add(f"{mod}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pipeline")}
    return {m for m in found if m != module_name(path)}


def graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in PIPELINE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in mods} for name, path in mods.items()}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


def test_every_module_lives_in_a_layer():
    loose = [p.name for p in PIPELINE.glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules outside the layers: {loose}"
    packages = {p.parent.name for p in PIPELINE.glob("*/__init__.py")}
    assert packages == set(RANK), f"packages {sorted(packages)} vs layers {sorted(RANK)}"


def test_imports_only_go_down():
    upward = []
    for mod, deps in graph().items():
        for dep in deps:
            a, b = layer(mod), layer(dep)
            if a and b and a != b and RANK[b] >= RANK[a]:
                upward.append(f"{mod} -> {dep}")
    assert not upward, "imports that go up or sideways:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    deps = graph()
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(deps.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(deps):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    """The walk is what the two tests above rely on: it must find a function-level import."""
    sample = PIPELINE / "core" / "steps.py"
    found = imports_of(sample)
    assert "pipeline.core.errors" in found
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(ast.parse(sample.read_text())))


def test_doit_list_imports_no_toolchain_and_runs_no_tool(tmp_path):
    """`doit list` on a fresh clone: no onnx, TVM, IREE or onnxruntime is imported, and no child
    process is started (the specs are read, nothing is run). A TFLite source's signature is read
    with the `tflite` flatbuffer package (which brings numpy): a parser, not a toolchain."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import subprocess, sys\n"
        "started = []\n"
        "real = subprocess.Popen.__init__\n"
        "def spy(self, *a, **k):\n"
        "    started.append(a[0] if a else k.get('args'))\n"
        "    return real(self, *a, **k)\n"
        "subprocess.Popen.__init__ = spy\n"
        "from doit.doit_cmd import DoitMain\n"
        "from doit.cmd_base import DodoTaskLoader\n"
        "code = DoitMain(DodoTaskLoader()).run(sys.argv[1:])\n"
        "heavy = sorted(m for m in ('onnx', 'tvm', 'iree', 'onnxruntime', 'onnxsim', "
        "'ai_edge_litert', 'xgboost') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
        "print('STARTED', started)\n"
        "sys.exit(code)\n")
    artifacts = tmp_path / "artifacts"  # a fresh clone: no memo, no store, no doit database
    proc = subprocess.run([sys.executable, str(probe), "list", "--all", f"artifacts={artifacts}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout
    assert "STARTED []" in proc.stdout, proc.stdout
    assert "build" in proc.stdout and "manifest" in proc.stdout


# ----------------------------------------------------------------------------- backends
def backend_words() -> dict[str, str]:
    """Each backend's name, artifact format and artifact file name -> its own module, where
    alone they may be compared (pipeline/compilers/<name>_backend.py, and the runtime module
    that defines the format it loads)."""
    from pipeline.compilers.backends import BACKENDS
    words = {}
    for b in BACKENDS:
        for word in (b.name, b.format, b.artifact):
            words[word] = b.name
    return words


def _strings(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def compared_backend_words(source: str, label: str, words: dict) -> list[str]:
    """`x == "tvm"`, `"iree" in skipped`, `fmt != "tvm-so"`, `c in ("iree", "tvm")`: a backend
    named by a string in a comparison, with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                found += [f"{label}:{node.lineno}: {ast.unparse(node)}"
                          for s in _strings(operand) if s in words]
    return found


def test_no_backend_is_chosen_by_comparing_its_name():
    """Callers ask the backend (compilers/backends.py: backend_of(abi).format, IREE.builds(abi));
    only a backend's own module compares its name, format or artifact file name."""
    words = backend_words()
    own = {f"pipeline/compilers/{name}_backend.py" for name in set(words.values())}
    found = []
    for path in sorted(PIPELINE.rglob("*.py")):
        label = str(path.relative_to(REPO))
        if label not in own:
            found += compared_backend_words(path.read_text(), label, words)
    assert not found, "backends chosen by comparing their names:\n" + "\n".join(found)


def test_the_backend_check_sees_the_forms_the_old_code_used():
    code = ('def f(abi, art, skipped):\n'
            '    a = compiler_of(abi) == "tvm"\n'
            '    b = "iree" not in skipped\n'
            '    c = art["format"] != "tvm-so"\n'
            '    d = abi.compiler in ("iree", "x")\n'
            '    e = art["format"] == FORMAT\n'
            '    f = {"iree": 1}["iree"]\n')
    found = compared_backend_words(code, "probe.py", backend_words())
    assert [f.split(": ", 1)[0] for f in found] == ["probe.py:2", "probe.py:3", "probe.py:4",
                                                    "probe.py:5"], found
