"""`doit cache status|push|gc|verify`: the local store and the remote cache, for people.

    status   the local store (objects, bytes, key records), the remote (URL, pull-only or push,
             signatures) and the last build's hit rates and bytes moved (remote.Stats' file)
    push     upload every local key record and its objects (after a build without network);
             needs the remote configured with pushing on (cache=URL cache_push=1)
    gc       keep the records the current outputs name (the `key` of every step.json under the
             artifacts folder) and their objects; with budget=SIZE (e.g. 2G) keep the newest
             records (a restore makes a record new again) whose objects fit, oldest removed first
    verify   check every object's sha256, evict damaged ones, drop records whose objects are gone

Each function returns the text to print and raises PipelineError on misuse. dodo.py wires them
as one task with positional arguments (the store's remote is set by store.configure at load):

    def task_cache():
        '''the build cache: doit cache status|push|gc|verify [budget=SIZE]'''
        def action(pos):
            return doit_call(cache.command, PROJECT.layout.root, pos, get_var("budget", None))
        return {"actions": [action], "pos_arg": "pos", "uptodate": [False], "verbosity": 2}

gc and verify change only the local store (a remote is pruned by its own means, e.g.
bazel-remote's size limit); run them when no build is running on the same artifacts folder.
"""
from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path

from ..core import remote, store
from ..core.errors import PipelineError
from ..core.layout import Layout

STAGE = "cache"
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
SKIP_DIRS = (".store", ".tmp", ".cache", "releases")  # no step.json of the current outputs there


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def parse_size(text: str) -> int:
    """'500M', '2G', '1.5GiB', '100000' -> bytes (K, M, G, T are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.I)
    if not m:
        raise PipelineError(f"budget={text!r} is not a size", stage=STAGE,
                            hint="write it as a number of bytes with an optional K, M, G or T "
                                 "(powers of 1024), e.g. budget=20G")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def _leaves_build_figures(fn):
    """The cache commands count nothing: the stats file keeps describing the last build."""
    @functools.wraps(fn)
    def command(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            store.forget_stats()
    return command


def _store(root) -> store.Store:
    return store.Store(Layout(Path(root)).store)


def _usage(st: store.Store) -> tuple[int, int, int]:
    objects = st.objects()
    return len(objects), sum(p.stat().st_size for p in objects), len(st.records())


def status(root) -> str:
    st = _store(root)
    n_obj, size, n_rec = _usage(st)
    lines = [f"local store   {st.root}: {n_rec} key records, {n_obj} objects, {human(size)}"]
    rem = store.configured_remote()
    if rem is None:
        lines.append("remote cache  none (set cache=URL, $MODELYARD_CACHE or [tool.modelyard] cache)")
    else:
        mode = "push" if rem.push_enabled else "pull-only (cache_push=1 to push)"
        trust = []
        if rem.signing_source:
            trust.append("pushed records signed")
        trust.append("pulled records must be signed by cache_pubkey" if rem.pubkey_source
                     else "pulled records unsigned-ok (no cache_pubkey)")
        lines.append(f"remote cache  {rem.url}: {mode}; {'; '.join(trust)}; timeout {rem.timeout:g} s")
    stats = remote.read_stats(Path(root))
    if not stats:
        lines.append("last build    no figures yet (a build that looks anything up writes them)")
        return "\n".join(lines)
    c = stats.get("counts", {})
    lookups = c.get("lookups", 0)
    local, pulled = c.get("local_hits", 0), c.get("remote_hits", 0)
    misses = lookups - local - pulled

    def rate(n):
        return f"{n} ({100 * n / lookups:.0f} %)" if lookups else str(n)
    started = stats.get("build", "").split("-", 1)[-1]
    lines.append(f"last build    {started}, remote {stats.get('remote') or 'none'}"
                 f"{' (push)' if stats.get('push') else ''}: {lookups} lookups: "
                 f"{rate(local)} local hits, {rate(pulled)} remote hits, {rate(misses)} misses; "
                 f"{c.get('stored', 0)} steps stored")
    lines.append(f"              pulled {c.get('objects_pulled', 0)} objects, "
                 f"{human(c.get('bytes_pulled', 0))}; pushed {c.get('records_pushed', 0)} records, "
                 f"{c.get('objects_pushed', 0)} objects, {human(c.get('bytes_pushed', 0))}; "
                 f"{c.get('damaged', 0)} damaged remote objects or records discarded, "
                 f"{c.get('rejected', 0)} unsigned or wrongly signed records ignored, "
                 f"{c.get('evicted', 0)} damaged local objects evicted")
    lines += [f"fault         {line}" for line in stats.get("faults", [])]
    return "\n".join(lines)


@_leaves_build_figures
def push(root) -> str:
    rem = store.configured_remote()
    if rem is None:
        raise PipelineError("no remote cache to push to", stage=STAGE,
                            hint="give cache=URL cache_push=1 (or $MODELYARD_CACHE, "
                                 "$MODELYARD_CACHE_PUSH, or [tool.modelyard] cache, cache_push)")
    if not rem.push_enabled:
        raise PipelineError(f"pushing to {rem.url} is off (the cache is pull-only by default)",
                            stage=STAGE, hint="say cache_push=1 (or $MODELYARD_CACHE_PUSH=1) on a "
                                              "trusted machine")
    st = _store(root)
    checked = st.verify()  # never upload bytes that rotted on this disk
    before = dict(rem.stats.counts)
    pushed = 0
    records = st.records()
    for path in records:
        record = st.read_record(path.stem)
        if record is None:
            continue
        try:
            rem.push(path.stem, record.get("stage", "?"), record["outputs"], st.object_path,
                     strict=True)
        except remote.RemoteFault as fault:
            raise PipelineError(f"pushing to {rem.url} failed: {fault} ({pushed} of "
                                f"{len(records)} records pushed before)", stage=STAGE,
                                hint="check the server, then run `doit cache push` again "
                                     "(what is there is skipped)") from None
        pushed += 1
    objects = rem.stats.counts["objects_pushed"] - before["objects_pushed"]
    sent = rem.stats.counts["bytes_pushed"] - before["bytes_pushed"]
    damaged = f"; {len(checked['damaged'])} damaged local objects evicted first" \
        if checked["damaged"] else ""
    return (f"pushed {pushed} key records to {rem.url}"
            f"{' (signed)' if rem.signing_source else ''}: {objects} objects uploaded, "
            f"{human(sent)} (objects the remote had were skipped){damaged}")


def current_keys(root) -> set[str]:
    """The key of every step.json under the artifacts folder: what the current outputs need."""
    keys = set()
    root = Path(root)
    for record in root.rglob("step.json"):
        if any(part in SKIP_DIRS for part in record.relative_to(root).parts):
            continue
        try:
            keys.add(json.loads(record.read_text())["key"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return keys


@_leaves_build_figures
def gc(root, budget: str | None = None) -> str:
    st = _store(root)
    records = st.records()
    if budget is None:
        needed = current_keys(root)
        if not needed:
            raise PipelineError(f"no step.json under {root}: nothing says which records are "
                                f"current, so gc would empty the store", stage=STAGE,
                                hint="build first, or keep a size: doit cache gc budget=SIZE")
        keep = [p for p in records if p.stem in needed]
        rule = f"the {len(needed)} keys the current outputs name"
    else:
        limit = parse_size(budget)
        keep, kept_objects, total = [], set(), 0
        for path in sorted(records, key=lambda p: p.stat().st_mtime, reverse=True):
            record = st.read_record(path.stem)
            if record is None:
                continue
            new = {(m["sha256"], m["size"]) for m in record["outputs"].values()} - kept_objects
            extra = sum(size for _, size in new)
            if total + extra > limit:
                break  # newest first: everything older goes
            keep.append(path)
            kept_objects |= new
            total += extra
        rule = f"the newest records within {human(limit)}"
    kept_keys = {p.stem for p in keep}
    removed_records = 0
    for path in records:
        if path.stem not in kept_keys:
            path.unlink(missing_ok=True)
            removed_records += 1
    live = set()
    for key in kept_keys:
        record = st.read_record(key)
        if record is not None:
            live |= {m["sha256"] for m in record["outputs"].values()}
    removed, freed, kept_bytes = 0, 0, 0
    for obj in st.objects():
        size = obj.stat().st_size
        if obj.name in live:
            kept_bytes += size
            continue
        obj.unlink(missing_ok=True)
        removed, freed = removed + 1, freed + size
    now = time.time()
    temp = sum(st._remove_stale(p, now) for p in (st.root / "objects").glob("*/.*.tmp"))
    return (f"kept {len(kept_keys)} key records ({rule}) and their {len(live)} objects, "
            f"{human(kept_bytes)}; removed {removed_records} records and {removed} objects, "
            f"{human(freed)}" + (f", and {temp} stale temporary files" if temp else ""))


@_leaves_build_figures
def verify(root) -> str:
    st = _store(root)
    s = st.verify()
    text = (f"checked {s['objects'] + len(s['damaged'])} objects ({human(s['bytes'])} intact) and "
            f"{s['records'] + len(s['dropped'])} key records in {st.root}: ")
    if not s["damaged"] and not s["dropped"]:
        text += "all intact"
    else:
        text += (f"evicted {len(s['damaged'])} damaged objects"
                 + (f" ({', '.join(d[:16] for d in s['damaged'])})" if s["damaged"] else "")
                 + f", dropped {len(s['dropped'])} records whose objects were gone or damaged "
                   f"(their steps run again, or are pulled again)")
    if s["temp"]:
        text += f"; removed {s['temp']} stale temporary files"
    return text


COMMANDS = {"status": status, "push": push, "gc": gc, "verify": verify}


def command(root, args, budget: str | None = None) -> str:
    """`doit cache <args>`: one of COMMANDS (budget=SIZE for gc only)."""
    args = list(args or [])
    if len(args) != 1 or args[0] not in COMMANDS:
        raise PipelineError(f"say what to do with the cache: doit cache {'|'.join(COMMANDS)} "
                            f"(got {' '.join(args) or 'nothing'})", stage=STAGE)
    if budget is not None and args[0] != "gc":
        raise PipelineError(f"budget= is for `doit cache gc`, not {args[0]}", stage=STAGE)
    return gc(root, budget) if args[0] == "gc" else COMMANDS[args[0]](root)
