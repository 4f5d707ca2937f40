"""The chaos audit's reading of learner restarts (benchmarks/chaos/audit.py `restarts`), on records
written as a learner writes them: what each restart trained again, against the most it may."""

from __future__ import annotations

from benchmarks.chaos.audit import restarts


def _line(run: str, wall: float, update: int, resumed: int) -> dict:
    return {"run_id": run, "wall": wall, "update": update, "resumed_update": resumed}


def test_a_restart_is_judged_from_the_update_it_resumed_not_its_first_record():
    # run a resumed 100 and trained to 180 in 60 s; killed; run b resumed 150 (a save at 30 s), and its
    # first record came after 13 more updates
    interval = 30.0
    a = [_line("a", w, 100 + round(w * 80 / 60), 100) for w in (2.0, 20.0, 40.0, 60.0)]
    b = [_line("b", 5.0, 163, 150)]
    (r,) = restarts(a + b, interval)
    assert (r["reached"], r["resumed"], r["redone"]) == (180, 150, 30)
    assert r["bound"] == 180 - 103  # trained after wall 60 - 30 - margin (the newest such record: wall 2)


def test_a_short_lived_predecessor_may_have_redone_everything_it_trained():
    a = [_line("a", 5.5, 1457, 1444), _line("a", 14.6, 1537, 1444)]  # the soak's case: no save in 15 s
    b = [_line("b", 5.7, 1454, 1444)]
    (r,) = restarts(a + b, 30.0)
    assert r["redone"] == 93 and r["bound"] == 93  # the first record's 1457 would have made it 80
