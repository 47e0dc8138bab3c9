"""The tuning database's files (pipeline/compilers/tuning_db.py), no TVM: a torn last line is
dropped with a warning and cut off before anything appends; any other bad line is an error;
merging and selecting keep MetaSchedule's bytes and renumber records by workload."""
from __future__ import annotations

import json

import pytest

from pipeline.compilers.tuning_db import (META, RECORDS, WORKLOADS, Database, DatabaseError, append,
                                       merge, read_lines, repair, select)

W = ['["11","AAAA"]', '["22","BBBB"]', '["33","CCCC"]']   # workload lines (shash, module)


def rec(i: int, secs: float, trace: str = "t") -> str:
    return f'[{i},[["{trace}"],[{secs}],{{"kind":"llvm"}},[]]]'


def folder_with(tmp_path, workloads, records, tail: str = "", meta: dict | None = None):
    (tmp_path / WORKLOADS).write_text("".join(f"{w}\n" for w in workloads))
    (tmp_path / RECORDS).write_text("".join(f"{r}\n" for r in records) + tail)
    if meta is not None:
        (tmp_path / META).write_text(json.dumps(meta))
    return tmp_path


def test_a_torn_last_record_is_dropped_with_a_warning_and_cut_off(tmp_path):
    torn = rec(0, 2e-5)[:17]                       # a kill midway through writing the line
    folder = folder_with(tmp_path, W[:1], [rec(0, 1e-5)], tail=torn)
    lines, dropped = read_lines(folder / RECORDS)
    assert lines == [rec(0, 1e-5)] and dropped == torn
    db = Database.read(folder)
    assert db.records == [(0, '[["t"],[1e-05],{"kind":"llvm"},[]]')]
    assert db.warnings == [f"{folder / RECORDS}: a torn last line (a trial cut short by a killed "
                           f"run) was left out"]
    warning = repair(folder / RECORDS)
    assert warning.startswith(f"{folder / RECORDS}: dropped its torn last line (17 characters")
    assert (folder / RECORDS).read_text() == rec(0, 1e-5) + "\n"   # the next append starts clean
    assert repair(folder / RECORDS) is None and Database.read(folder).warnings == []


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path):
    folder = folder_with(tmp_path, W[:1], [], tail=rec(0, 1e-5))
    assert read_lines(folder / RECORDS) == ([rec(0, 1e-5)], None)
    assert repair(folder / RECORDS) is None
    assert (folder / RECORDS).read_text() == rec(0, 1e-5) + "\n"


def test_a_bad_line_before_the_last_is_corruption_not_a_kill(tmp_path):
    folder = folder_with(tmp_path, W[:1], [rec(0, 1e-5), "[0,[[", rec(0, 2e-5)])
    with pytest.raises(DatabaseError) as err:
        Database.read(folder)
    assert str(err.value) == (f"{folder / RECORDS}: line 2 of 3 is not JSON, and only the last "
                              f"line can be cut short by a killed run")


def test_records_of_a_workload_lost_with_its_torn_line_are_left_out(tmp_path):
    folder = folder_with(tmp_path, W[:1], [rec(0, 1e-5), rec(1, 1e-5)])
    (folder / WORKLOADS).write_text(W[0] + "\n" + W[1][:5])
    db = Database.read(folder)
    assert db.workloads == W[:1] and db.records == [(0, '[["t"],[1e-05],{"kind":"llvm"},[]]')]
    assert len(db.warnings) == 2 and "1 record(s) name a workload" in db.warnings[1]
    assert read_lines(tmp_path / "missing.json") == ([], None)


def test_select_takes_a_models_workloads_in_its_task_order_and_renumbers(tmp_path):
    db = Database(W, [(0, "[1]"), (1, "[2]"), (2, "[3]"), (0, "[4]")], {"exhausted": {"2": 1}})
    part = select(db, keys=["k0", "k1", "k2"], wanted=["k2", "k0", "kx"])
    assert part.workloads == [W[2], W[0]]
    assert part.records == [(1, "[1]"), (0, "[3]"), (1, "[4]")]   # measured order kept
    assert part.meta["exhausted"] == {"0": 1}
    part.write(tmp_path)
    assert (tmp_path / RECORDS).read_text() == "[1,[1]]\n[0,[3]]\n[1,[4]]\n"
    assert Database.read(tmp_path).counts() == [1, 2]


def test_merge_appends_only_what_is_new_and_moves_nothing(tmp_path):
    folder = folder_with(tmp_path, W[:2], [rec(0, 1e-5), rec(1, 2e-5)], meta={"identity": {"x": 1}})
    dst = Database.read(folder)
    src = Database([W[1], W[2]], [(0, '[["t"],[2e-05],{"kind":"llvm"},[]]'), (1, "[3]"), (0, "[4]")],
                   {"exhausted": {"1": 1}})
    merged = merge(dst, ["k0", "k1"], src, ["k1", "k2"])
    assert merged.workload_lines == [W[2]] and merged.keys == ["k2"]
    assert merged.records == [(2, "[3]"), (1, "[4]")]        # the duplicate of dst's record is not
    assert merged.exhausted == {"2": 1}
    append(folder, merged, dst.meta)
    after = Database.read(folder)
    assert after.workloads == W and after.counts() == [1, 2, 1] and after.exhausted() == {2}
    assert after.meta["identity"] == {"x": 1}
    assert not merge(after, ["k0", "k1", "k2"], src, ["k1", "k2"])   # nothing new the second time


def test_what_a_models_own_pin_says_of_dry_workloads(tmp_path):
    """A model's own pin (or a step's output) has no database.json: its tune.json says where it
    was measured and, for the older ones, a finished run with budget left marks the workloads
    short of per_task as dry (ppocr_cls's: 107 of 108 trials, one reshape with one candidate)."""
    from pipeline.compilers.tvm_tuner import source_meta
    folder = folder_with(tmp_path, W[:2], [rec(0, 1e-5), rec(0, 2e-5), rec(1, 3e-5)])
    place = {"runner": "local", "machine": "AMD EPYC", "emulated": False}
    report = {"trials_spent": 3, "trials_budget": 4, "per_task": 2, "measured_on": place}
    (folder / "tune.json").write_text(json.dumps(report))
    db = Database.read(folder)
    assert source_meta(folder, db) == {"exhausted": {"1": 1}, "measured_on": [place]}
    (folder / "tune.json").write_text(json.dumps({**report, "trials_budget": 3}))
    assert source_meta(folder, db)["exhausted"] == {}           # budget spent: nothing proven dry
    (folder / "tune.json").write_text(json.dumps({**report, "exhausted_workloads": [0]}))
    assert source_meta(folder, db)["exhausted"] == {"0": 2}     # newer outputs say it themselves
