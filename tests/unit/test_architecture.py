"""The package's layers, read from the source: imports go one way, none in a circle; and the
module map of docs/architecture.md, generated from the same source.

Every import counts, including those inside functions (they are how the heavy toolchains are
kept out of `doit list`, and they are where cycles used to hide), and so does the package an
import runs first: `from ..spec import X` imports pipeline/spec/__init__.py, and importing
`pipeline.x.y` from outside `x/` runs pipeline/x/__init__.py (and what it imports). Only imports
under `if TYPE_CHECKING:` are left out: they never run.

    python tests/unit/test_architecture.py --write    # regenerate docs/architecture.md's maps
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipeline"
DOC = REPO / "docs" / "architecture.md"

# Top to bottom: a package may import its own modules and those of any package below it.
LAYERS = [
    (("bench", "release", "diagnose"),
     "commands beside the build (doit bench, profile, search / release, verify, keygen, cache / bisect)"),
    (("graph",), "the Project, the one table of stages, and the commands that read the graph"),
    (("stages",), "one module per doit stage: a row of graph/stages.py's STAGES each"),
    (("app",), "the app-side runtime helper: Runner picks the artifact this machine can run (asking its backend)"),
    (("compilers",), "the backends and their table, which ABIs a model is built for, the compilers' facts"),
    (("run",), "runners of artifacts and models (IREE, TVM, RKNN, onnxruntime, qemu, Vulkan), timing"),
    (("rewrite",), "graph rewrites (ONNX -> ONNX) and conversions of TFLite / NNEF sources to ONNX"),
    (("spec",), "typed specs of models and targets"),
    (("core",), "errors, layout, store (+ remote), tools, steps, lock, codehash, settings, signing"),
]
RANK = {pkg: len(LAYERS) - i for i, (names, _) in enumerate(LAYERS) for pkg in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_block(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Names of `pipeline` modules and packages that the source of `module` imports, anywhere in
    it (a name may be an attribute: graph() keeps those that are modules)."""
    tree = ast.parse(source)
    skip = {id(n) for block in ast.walk(tree) if _type_checking_block(block)
            for n in ast.walk(block)}
    package = module.split(".") if is_package else module.split(".")[:-1]
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
            if mod != "pipeline" and not mod.startswith("pipeline."):
                continue
            found.add(mod)  # the package or module itself: `from ..spec import X` runs spec/__init__
            found |= {f"{mod}.{alias.name}" for alias in node.names}  # `from . import x`: the module x
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == "pipeline" or a.name.startswith("pipeline.")}
    return {m for m in found if m != module}


def imports_of(path: Path) -> set[str]:
    """Modules of `pipeline` that `path` imports, anywhere in the file."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def with_packages(module: str, imported: set[str]) -> set[str]:
    """The imports and the packages they run first: importing pipeline.x.y from outside x/ runs
    pipeline/x/__init__.py (a module inside x/ is itself loaded by then, so not for it)."""
    own = module.split(".")
    out = set(imported)
    for name in imported:
        parts = name.split(".")
        for i in range(2, len(parts)):
            if parts[:i] != own[:i]:
                out.add(".".join(parts[:i]))
    return out


@lru_cache(maxsize=None)
def graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in PIPELINE.rglob("*.py")}
    return {name: {m for m in with_packages(name, imports_of(path)) if m in mods}
            for name, path in mods.items()}


def layer(module: str) -> str | None:
    """The layer of a module or package (pipeline.spec and pipeline.spec.model: spec)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward(deps: dict[str, set[str]]) -> list[str]:
    """Imports that go up or sideways: to a package of the same rank or above, not its own."""
    found = []
    for mod, targets in deps.items():
        for dep in targets:
            a, b = layer(mod), layer(dep)
            if a and b and a != b and RANK[b] >= RANK[a]:
                found.append(f"{mod} -> {dep}")
    return sorted(found)


def test_every_module_lives_in_a_layer():
    loose = [p.name for p in PIPELINE.glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules outside the layers: {loose}"
    packages = {p.parent.name for p in PIPELINE.glob("*/__init__.py")}
    assert packages == set(RANK), f"packages {sorted(packages)} vs layers {sorted(RANK)}"


def test_imports_only_go_down():
    found = upward(graph())
    assert not found, "imports that go up or sideways:\n" + "\n".join(found)


def test_a_package_import_counts():
    """`from ..spec import X` in core/ imports pipeline/spec/__init__.py: an upward import, caught
    like `from ..spec.model import X`; and importing pipeline.spec.model from core/ runs the
    package's __init__ too."""
    mods = set(graph())
    for source in ("from ..spec import load_model\n",
                   "def f():\n    from ..spec import ModelSpec\n",
                   "import pipeline.spec\n"):
        deps = {m for m in imports_in(source, "pipeline.core.probe") if m in mods}
        assert upward({"pipeline.core.probe": deps}) == ["pipeline.core.probe -> pipeline.spec"], source
    deps = with_packages("pipeline.core.probe", imports_in("from ..spec.model import X\n",
                                                           "pipeline.core.probe"))
    assert {"pipeline.spec", "pipeline.spec.model"} <= deps
    # inside its own package a module does not run the package's __init__ again
    assert with_packages("pipeline.spec.model", {"pipeline.spec.common"}) == {"pipeline.spec.common"}


def test_every_stage_module_is_a_stage():
    """stages/ holds stages: each of its modules is the module of a row of STAGES."""
    from pipeline.graph.stages import STAGES
    rows = {s.module.__name__ for s in STAGES}
    modules = {module_name(p) for p in (PIPELINE / "stages").glob("*.py") if p.name != "__init__.py"}
    assert modules == rows, f"in stages/ but not a stage: {sorted(modules - rows)}"


def stage_imports(deps: dict[str, set[str]]) -> list[str]:
    """Imports of one stage module by another (anywhere in it, functions included)."""
    stages = "pipeline.stages."
    return sorted(f"{mod} -> {dep}" for mod, targets in deps.items() if mod.startswith(stages)
                  for dep in targets if dep.startswith(stages) and dep != mod)


def test_the_stages_are_peers():
    """No stage imports another (issue 41 item 3): what two stages share lives a layer below,
    so that a stage's code digest covers no sibling stage."""
    found = stage_imports(graph())
    assert not found, "stage modules importing other stages:\n" + "\n".join(found)


def test_the_peer_check_sees_a_sibling_import():
    mods = set(graph())
    for source in ("from .static import bind_inputs\n", "def f():\n    from . import static\n",
                   "from pipeline.stages.static import bind_inputs\n"):
        deps = {m for m in with_packages("pipeline.stages.coverage",
                                         imports_in(source, "pipeline.stages.coverage")) if m in mods}
        assert stage_imports({"pipeline.stages.coverage": deps}) == [
            "pipeline.stages.coverage -> pipeline.stages.static"], source


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


# An import inside a function must save something measured on the way to `doit list`: a comment
# on its lines (or the comment line just above them) names what it costs, "<what>: <N> s" or
# "<what>: ... only". An import that costs nothing goes to the top. A try/except ImportError is a
# probe of what is installed, not a deferral.
COST_COMMENT = re.compile(r"#\s*[^:\n]+: (\d+(?:\.\d+)? s\b|[^\n,;]*\bonly\b)")


def uncommented_function_imports(source: str, label: str) -> list[str]:
    tree = ast.parse(source)
    lines = source.splitlines()
    probes = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
              and any("ImportError" in ast.unparse(h.type or ast.Name("BaseException")) for h in t.handlers)
              for stmt in t.body for n in ast.walk(stmt)}
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in probes:
                continue
            text = lines[node.lineno - 1:node.end_lineno]
            above = node.lineno - 2  # a comment above a run of imports speaks for the run
            while above >= 0 and lines[above].strip().startswith(("import ", "from ", "#")):
                if lines[above].strip().startswith("#"):
                    text.insert(0, lines[above])
                above -= 1
            if not any(COST_COMMENT.search(t) for t in text):
                found.append(f"{label}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_import_inside_a_function_names_its_cost():
    found = []
    for path in sorted(PIPELINE.rglob("*.py")) + [REPO / "dodo.py"]:
        found += uncommented_function_imports(path.read_text(), str(path.relative_to(REPO)))
    assert not found, ("imports inside functions that say no cost (move them to the top, or say "
                       "what they save: `# onnx: 1.5 s, not needed by doit list`):\n" + "\n".join(found))


def test_the_cost_check_sees_a_silent_import():
    code = ("def f():\n    import json\n"
            "def g():\n    import onnx  # onnx: 1.5 s, not needed by doit list\n"
            "def h():\n    # tvm: 2.8 s, not needed by doit list\n    import tvm\n"
            "def i():\n    try:\n        import rknnlite.api\n    except ImportError:\n        pass\n")
    assert uncommented_function_imports(code, "probe.py") == ["probe.py:2: import json"]


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


# ----------------------------------------------------------------------------- the module map
# docs/architecture.md's layer diagram and module list are generated from LAYERS and the modules
# themselves (line count, the docstring's first line): the test below fails when they drift.
BEGIN, END = "<!-- begin {} (generated: python tests/unit/test_architecture.py --write) -->", "<!-- end {} -->"


def layer_diagram() -> str:
    rows = [("dodo.py", "doit wiring: one task per row of the stage table, and the commands")]
    rows += [("  " + "  ".join(f"{n}/" for n in names), what) for names, what in LAYERS]
    width = max(len(name) for name, _ in rows) + 3
    return "\n".join(f"{name:<{width}}{what}".rstrip() for name, what in rows)


def module_list() -> str:
    """Per package, bottom layer first: one line per module, its line count and the first line
    of its docstring (a package's __init__.py only when it has one)."""
    lines = []
    for names, _ in reversed(LAYERS):
        for name in names:
            lines.append(f"pipeline/{name}/")
            files = sorted((PIPELINE / name).glob("*.py"), key=lambda p: (p.name != "__init__.py", p.name))
            for path in files:
                text = path.read_text()
                doc = ast.get_docstring(ast.parse(text))
                if path.name == "__init__.py" and not doc:
                    continue
                first = (doc or "").strip().splitlines()[0] if doc else "(no docstring)"
                lines.append(f"  {path.name:<22}{len(text.splitlines()):>5}  {first}")
    return "\n".join(lines)


def render_doc(text: str) -> str:
    """The doc with its generated blocks made current."""
    for block, body in (("layers", layer_diagram()), ("modules", module_list())):
        begin, end = BEGIN.format(block), END.format(block)
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise AssertionError(f"{DOC.name} lacks the {block} block ({begin} ... {end})")
        text = pattern.sub(lambda _: f"{begin}\n```\n{body}\n```\n{end}", text)
    return text


def test_the_module_map_is_current():
    text = DOC.read_text()
    assert text == render_doc(text), (f"{DOC.relative_to(REPO)} is out of date with the code: run "
                                      f"`python tests/unit/test_architecture.py --write`")


def test_the_layers_table_names_every_layer():
    rows = set(re.findall(r"^\| `(\w+)/` \|", DOC.read_text(), re.M))
    assert rows == set(RANK), f"layers table: {sorted(rows)} vs LAYERS: {sorted(RANK)}"


def prose_module_names(row: str, layer: str) -> list[str]:
    """The modules a row of the layers table names (`x.py` in its layer, `other/x.py` in
    another, or a file at the top of the repository such as `dodo.py`) that are not there."""
    missing = []
    for folder, file in re.findall(r"`(?:(\w+)/)?(\w+\.py)`", row):
        where = PIPELINE / (folder or layer) / file
        if not where.is_file() and not (not folder and (REPO / file).is_file()):
            missing.append(f"{folder + '/' if folder else ''}{file}")
    return missing


def layer_rows() -> dict[str, str]:
    return dict(re.findall(r"^\| `(\w+)/` \| (.*)$", DOC.read_text(), re.M))


def test_the_layers_table_names_only_modules_that_exist():
    """The prose of each layer's row: a module it names (`tuning_db.py`, `graph/stages.py`) is a
    module of that layer (or of the layer it names), so that a move or a rename shows here."""
    stale = {layer: missing for layer, row in layer_rows().items()
             if (missing := prose_module_names(row, layer))}
    assert not stale, f"{DOC.name}'s layers table names modules that are not there: {stale}"


def test_the_core_row_names_every_core_module():
    """core/ is the layer every other stands on: its row says what each of its modules is for."""
    row = layer_rows()["core"]
    modules = sorted(p.name for p in (PIPELINE / "core").glob("*.py") if p.name != "__init__.py")
    unnamed = [m for m in modules if f"`{m}`" not in row]
    assert not unnamed, f"{DOC.name}'s core row does not name {unnamed}"


def test_the_prose_check_sees_a_stale_name():
    assert prose_module_names("the store (`store.py`), `graph/stages.py`, `gone.py`", "core") == ["gone.py"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/unit/test_architecture.py --write")
    DOC.write_text(render_doc(DOC.read_text()))
    print(f"wrote {DOC.relative_to(REPO)}")
