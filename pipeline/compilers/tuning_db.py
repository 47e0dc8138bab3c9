"""MetaSchedule's JSON tuning database as files, and a budget's arithmetic against one.

    <folder>/
      database_workload.json       MetaSchedule's: one workload per line, [shash, TIR module]
      database_tuning_record.json  MetaSchedule's: one measured trial per line, [workload index, record]
      database.json                ours: what the trials were measured for (TVM target, TVM
                                   versions), where, and which workloads' search spaces ran dry

Both MetaSchedule files are append-only JSON lines, written a line at a time as trials are
measured. A run killed while writing leaves at most its last line cut short, and MetaSchedule's
own reader fails on any bad line: `read_lines` drops a torn last line with a warning, and
`repair` truncates the file there so that the next append starts on a line of its own. A bad
line anywhere else is not a kill's doing: DatabaseError, naming the file and the line.

Workloads are matched by identity keys the caller computes (tvm_tune's child: the structural
hash of the TIR module, confirmed by structural equality, as MetaSchedule matches them): this
module never imports TVM, so that its rules are tested without it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..core.store import atomic_write_text, pretty_json

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
META = "database.json"
_RECORD = re.compile(r"^\[\s*(\d+)\s*,(.*)\]$", re.S)   # [workload index, record]


class DatabaseError(ValueError):
    """A database file broken otherwise than by a torn last line."""


def read_lines(path: Path) -> tuple[list[str], str | None]:
    """The complete JSON lines of an append-only file, and its torn last line (None if none).

    The last line is torn when it is not valid JSON (its writer was killed midway through it); a
    last line that is valid JSON but lacks its newline is complete, and kept. A missing file has
    no lines."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return [], None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    out: list[str] = []
    torn = None
    for number, line in enumerate(lines, 1):
        try:
            json.loads(line)
        except ValueError:
            if number < len(lines):
                raise DatabaseError(f"{path}: line {number} of {len(lines)} is not JSON, and only "
                                    f"the last line can be cut short by a killed run") from None
            torn = line
            continue
        out.append(line)
    return out, torn


def repair(path: Path) -> str | None:
    """Make an append-only JSON-lines file safe to read and append to: drop a torn last line,
    end the last line with its newline. Returns the warning to show, or None (nothing to do)."""
    path = Path(path)
    lines, torn = read_lines(path)
    if torn is None and (not lines or path.read_bytes().endswith(b"\n")):
        return None
    atomic_write_text(path, "".join(f"{line}\n" for line in lines))
    if torn is None:
        return None
    return (f"{path}: dropped its torn last line ({len(torn)} characters, cut short by a run "
            f"that was killed while writing it); the {len(lines)} complete line(s) are kept")


@dataclass
class Database:
    """A database folder in memory: workload lines and records as written (never re-serialised,
    so that copies keep MetaSchedule's bytes), and our metadata."""
    workloads: list[str]
    records: list[tuple[int, str]]            # (workload index, the record's JSON text)
    meta: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> "Database":
        folder = Path(folder)
        warnings = []
        workloads, torn = read_lines(folder / WORKLOADS)
        if torn is not None:
            warnings.append(f"{folder / WORKLOADS}: a torn last line was left out")
        lines, torn = read_lines(folder / RECORDS)
        if torn is not None:
            warnings.append(f"{folder / RECORDS}: a torn last line (a trial cut short by a killed "
                            f"run) was left out")
        records, orphans = [], 0
        for number, line in enumerate(lines, 1):
            match = _RECORD.match(line)
            if not match:
                raise DatabaseError(f"{folder / RECORDS}: line {number} is not a [workload index, "
                                    f"record] pair")
            index = int(match.group(1))
            if index >= len(workloads):
                orphans += 1
                continue
            records.append((index, match.group(2)))
        if orphans:
            warnings.append(f"{folder / RECORDS}: {orphans} record(s) name a workload the workload "
                            f"file lacks (lost with its torn line): left out")
        try:
            meta = json.loads((folder / META).read_text())
        except FileNotFoundError:
            meta = {}
        except ValueError:
            raise DatabaseError(f"{folder / META} is not JSON") from None
        return cls(workloads, records, meta, warnings)

    def counts(self) -> list[int]:
        """Per workload (by index): the trials recorded for it, failed ones included."""
        out = [0] * len(self.workloads)
        for index, _ in self.records:
            out[index] += 1
        return out

    def exhausted(self) -> set[int]:
        """The workloads whose search space ran dry in a finished run (see Plan)."""
        return {int(i) for i in self.meta.get("exhausted", {})}

    def write(self, folder: Path) -> None:
        """The whole database into `folder`, each file replaced atomically (outputs, pins)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / WORKLOADS, "".join(f"{w}\n" for w in self.workloads))
        atomic_write_text(folder / RECORDS, "".join(f"{record_line(i, r)}\n" for i, r in self.records))
        atomic_write_text(folder / META, pretty_json(self.meta))


def record_line(index: int, record: str) -> str:
    return f"[{index},{record}]"


def select(db: Database, keys: list, wanted: list) -> Database:
    """The part of `db` for the workloads whose keys are `wanted`, in that order (those `db`
    lacks are left out): their lines, then their records in the order they were measured,
    renumbered; their exhausted marks. `keys[i]` is the identity of `db.workloads[i]`."""
    order: list = []
    for key in wanted:
        if key in keys and key not in order:
            order.append(key)
    new_of_key = {key: n for n, key in enumerate(order)}
    first = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    new = {i: new_of_key[key] for i, key in enumerate(keys) if key in new_of_key}
    exhausted = {str(new[i]): n for i, n in sorted((int(k), v) for k, v in
                                                   db.meta.get("exhausted", {}).items()) if i in new}
    return Database(workloads=[db.workloads[first[key]] for key in order],
                    records=[(new[i], r) for i, r in db.records if i in new],
                    meta={**db.meta, "exhausted": exhausted})


@dataclass
class Merge:
    """What appending one database to another adds, in the destination's numbering."""
    workload_lines: list[str]
    records: list[tuple[int, str]]
    exhausted: dict[str, int]
    keys: list                      # the identity keys of workload_lines

    def __bool__(self) -> bool:
        return bool(self.workload_lines or self.records or self.exhausted)


def merge(dst: Database, dst_keys: list, src: Database, src_keys: list) -> Merge:
    """Append `src` to `dst`: its workloads that `dst` lacks (by key), its records that `dst`
    does not already hold (same workload, same record text), its exhausted marks. Nothing of
    `dst` moves: MetaSchedule appends to these files, and records name workloads by line."""
    index = {}
    for i, key in enumerate(dst_keys):
        index.setdefault(key, i)
    new_lines, new_keys = [], []
    for key, line in zip(src_keys, src.workloads):
        if key not in index:
            index[key] = len(dst.workloads) + len(new_lines)
            new_lines.append(line)
            new_keys.append(key)
    seen = {(dst_keys[i], r) for i, r in dst.records}
    records = []
    for i, r in src.records:
        key = src_keys[i]
        if (key, r) not in seen:
            seen.add((key, r))
            records.append((index[key], r))
    have = {int(i) for i in dst.meta.get("exhausted", {})}
    exhausted = {}
    for i, n in src.meta.get("exhausted", {}).items():
        target = index[src_keys[int(i)]]
        if target not in have:
            exhausted[str(target)] = n
    return Merge(new_lines, records, exhausted, new_keys)


def append(folder: Path, merged: Merge, meta: dict) -> None:
    """Add a Merge to a database folder in place (its files must end with a newline: `repair`)."""
    folder = Path(folder)
    for name, lines in ((WORKLOADS, merged.workload_lines),
                        (RECORDS, [record_line(i, r) for i, r in merged.records])):
        if lines:
            with open(folder / name, "a") as f:
                f.write("".join(f"{line}\n" for line in lines))
    if merged.exhausted:
        atomic_write_text(folder / META, pretty_json(
            {**meta, "exhausted": {**meta.get("exhausted", {}), **merged.exhausted}}))


# ----------------------------------------------------------------------------- the budget
@dataclass(frozen=True)
class Plan:
    """A model's budget against what a database already holds for its tasks.

    Per task, the trials recorded for its workload count towards the budget up to `per_task`
    (a workload shared with another model counts for both); a task needs `per_task` minus those,
    or none when its search space ran dry in a finished run (`exhausted`: MetaSchedule found no
    candidate it had not measured). What a run may still spend is the smaller of the budget left
    and what the tasks need. The budget is covered when that is 0.
    """
    trials: int
    per_task: int
    have: tuple[int, ...]
    need: tuple[int, ...]

    @property
    def already(self) -> int:
        return min(self.trials, sum(min(h, self.per_task) for h in self.have))

    @property
    def remaining(self) -> int:
        return max(0, min(self.trials - self.already, sum(self.need)))

    @property
    def covered(self) -> bool:
        return self.remaining == 0

    def batches(self) -> list[tuple[int, list[int]]]:
        """The tasks to tune, grouped by the trials each still needs (MetaSchedule takes one
        per-task cap per run), the largest need first: [(cap, task indices)]."""
        groups: dict[int, list[int]] = {}
        for task, need in enumerate(self.need):
            if need:
                groups.setdefault(need, []).append(task)
        return sorted(groups.items(), key=lambda g: -g[0])

    def describe(self) -> str:
        done = sum(1 for n in self.need if n == 0)
        return (f"{self.already} of {self.trials} trials already measured ({done} of "
                f"{len(self.need)} tasks need no more)")


def plan(have: list[int], exhausted: list[bool], trials: int, per_task: int) -> Plan:
    """The Plan of a budget (`trials` in all, at most `per_task` per task) for tasks whose
    workloads have `have` trials recorded, `exhausted` telling which ran dry."""
    if len(have) != len(exhausted):
        raise ValueError("have and exhausted must list the same tasks")
    need = tuple(0 if dry else max(0, per_task - h) for h, dry in zip(have, exhausted))
    return Plan(trials, per_task, tuple(have), need)


def exhausted_after(run_budget: int, spent: int, caps: dict[int, int], have: dict[int, int]) -> list[int]:
    """The tasks a finished run found dry: MetaSchedule stops early, with budget left, only once
    every task has ended, and a task ends short of its cap only when its search space has no
    candidate left. With no budget left, nothing can be said. `caps`/`have`: per task, the cap
    of the run and the trials it recorded in the run."""
    if spent >= run_budget:
        return []
    return sorted(t for t, cap in caps.items() if have.get(t, 0) < cap)
