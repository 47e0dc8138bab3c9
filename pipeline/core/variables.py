"""The variables a command takes (`name=value` after it): one table.

It is read three times: `check` refuses a variable no command takes (doit itself would ignore
it, and build the defaults: `modles=DIR` built models/), naming the closest known one;
`help_text` is what `doit help COMMAND` prints after doit's line; and a test compares it with
README.md's table of variables. `ALL`: every command (the project is loaded for each).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .errors import PipelineError

ALL = "all"


@dataclass(frozen=True)
class Variables:
    shown: str                    # as written after the command: "warmup=N iterations=N"
    commands: tuple[str, ...]     # the commands that read them, or (ALL,)
    meaning: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(re.findall(r"(?:^|\s)([a-z_]+)=", self.shown))


VARIABLES = (
    Variables("target=NAME", (ALL,), "one target (default: every known target); an unknown name "
              "lists the known ones"),
    Variables("models=DIR", (ALL,), "the folder of the model folders, DIR/<name>/model.yaml "
              "(default models/)"),
    Variables("artifacts=DIR", (ALL,), "the build output (default artifacts/)"),
    Variables("targets=DIR", (ALL,), "another target registry (default pipeline/targets/)"),
    Variables("wait=0", (ALL,), "fail at once when another build holds the artifacts folder "
              "(default: wait)"),
    Variables("cache=URL cache_push=1", (ALL,), "a remote build cache (file://, http(s)://, s3://, "
              "gs://; or $MODELYARD_CACHE); pull-only unless cache_push=1"),
    Variables("cache_pubkey=PATH cache_key=PATH cache_timeout=S", (ALL,), "pull only records "
              "signed by this key; sign pushed records; seconds before a silent server counts as down"),
    Variables("executor=dask scheduler=tcp://HOST:8786", ("build", "tune"), "run the steps on a "
              "Dask cluster, through the remote cache (docs/cluster.md); auto: else here"),
    Variables("scheduler=tcp://HOST:8786", ("cluster",), "the Dask scheduler to ask"),
    Variables("revalidate=1", ("build",), "run validation here even when the cache has its result"),
    Variables("search=SECONDS untuned=1", ("build",), "the time a model with no pinned config may "
              "spend ranking its configs, per host ABI (or $MODELYARD_SEARCH); untuned=1: build "
              "the untuned TVM artifacts that cannot win too"),
    Variables("warmup=N iterations=N seconds=S threads=N", ("bench",), "the timing window "
              "(defaults: 3, 200, 20 s, every usable CPU)"),
    Variables("baseline=PATH threshold=PCT gate=0|1", ("bench",), "flag p50 regressions against "
              "an earlier bench.json (default 10 %); gate=1 exits non-zero on one"),
    Variables("profile=1", ("bench",), "`doit profile` each model first (its top 10 in the report)"),
    Variables("model=NAME", ("accuracy", "tune", "profile", "search", "bisect"), "one model (or "
              "one variant, ppocr_cls.int8)"),
    Variables("abi=NAME", ("profile", "bisect"), "one ABI of the target"),
    Variables("iterations=N rounds=N warmup=N threads=N", ("profile",), "the timing window"),
    Variables("warmup=N rounds=N seconds=S", ("search",), "the timing window per model"),
    Variables("tracker=HOST:PORT key=KEY emulated=1 pin=1", ("tune",), "tune on the TVM RPC board "
              "farm; pin=1 copies the database into the model folder"),
    Variables("curve=1 points=0,25,50,100 rounds=N seconds=S warmup=N threads=N", ("tune",),
              "trials vs latency, measured at these trial counts"),
    Variables("version=SEMVER key=PATH runtime=0", ("release",), "the version (immutable once "
              "released); the private key (or $MODELYARD_SIGNING_KEY); runtime=0: without the C runtime"),
    Variables("format=tar,deb drop=NAME,NAME", ("release",), "tar (the default) publishes the "
              "bundle, deb cuts Debian packages; the models the previous release shipped that "
              "this one may lack"),
    Variables("bundle=PATH pubkey=PATH into=DIR", ("verify",), "a release folder or archive; the "
              "key it must be signed with (or $MODELYARD_VERIFY_KEY, or verify_key); where to unpack"),
    Variables("integrity_only=1", ("verify",), "check integrity without a pinned key"),
    Variables("key=PATH", ("keygen",), "where to write the private key (0600) and PATH.pub"),
    Variables("source=PATH name=NAME shape=INPUT:1x3x224x224 value=INPUT:16000 license=PATH", ("new",),
              "the model file (or NNEF folder); the model's name; an input's shape or a named dim's "
              "value (several shape= allowed; the last ':' ends the input's name); an input bound "
              "to one value (a sample rate: the spec's `value`, several allowed); its licence file"),
    Variables("budget=SIZE", ("cache",), "gc: keep the newest records whose objects fit (e.g. 2G)"),
)
NAMES = frozenset(n for row in VARIABLES for n in row.names)

# Commands that need no model: doit's own that only read the graph, and those that never read
# the models (an empty models folder is where `doit new` starts)
NO_MODEL_COMMANDS = frozenset({"new", "verify", "keygen", "cache", "cluster", "list", "info",
                               "help", "tabcompletion", "dumpdb", "forget", "ignore", "clean",
                               "strace", "reset-dep"})


def given(argv: list[str]) -> list[str]:
    """The names of the variables on a doit command line (what doit takes as variables)."""
    return [a.split("=", 1)[0] for a in argv if a and a[0] != "-" and "=" in a]


def words(argv: list[str]) -> list[str]:
    """The command and task names of a doit command line (no option, no variable)."""
    return [a for a in argv if a and a[0] != "-" and "=" not in a]


def check(argv: list[str]) -> PipelineError | None:
    """An error for the first variable no command takes, naming the closest known one."""
    for name in given(argv):
        if name in NAMES:
            continue
        close = difflib.get_close_matches(name, sorted(NAMES), n=1, cutoff=0.6)
        command = next((w for w in words(argv) if w in commands()), "build")
        return PipelineError(
            f"unknown variable {name}=" + (f": did you mean {close[0]}=?" if close else ""),
            hint=f"`doit help {command}` lists the variables {command} takes")
    return None


def commands() -> set[str]:
    return {c for row in VARIABLES for c in row.commands if c != ALL}


def help_text(command: str, width: int = 22) -> str:
    """The variables `command` takes, its own first, as `doit help COMMAND` prints them."""
    def lines(rows):
        return [f"  {r.shown.ljust(width)}  {r.meaning}" if len(r.shown) <= width else
                f"  {r.shown}\n  {' ' * width}  {r.meaning}" for r in rows]
    own = [r for r in VARIABLES if command in r.commands]
    return "\n".join([f"\nvariables (name=value after `doit {command}`):"] + lines(own)
                     + [f"{'and those' if own else 'those'} of every command:"]
                     + lines([r for r in VARIABLES if ALL in r.commands]))


def help_topic(argv: list[str]) -> str | None:
    """The command `doit help COMMAND` asks about, when it is a task."""
    w = words(argv)  # `-f dodo.py help build`: the option's value is a word too
    at = w.index("help") + 1 if "help" in w else len(w)
    return w[at].split(":")[0] if at < len(w) else None


def needs_models(argv: list[str]) -> bool:
    """Whether the command reads the models (build and every stage, bench, tune...): an empty
    models folder is then a mistake, not an empty build."""
    return not set(words(argv)) & NO_MODEL_COMMANDS
