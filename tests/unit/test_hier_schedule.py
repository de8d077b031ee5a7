"""The choice between the hierarchical schedule and the flat group across hosts
(gosym.hier.schedule) and its table of measurements (gosym.hier.measured): the table says what
its results files say and cites files that exist, the rule between measured sizes, the
default for what was not measured, the link between hosts (GOSYM_HIER_LINK) and
GOSYM_HIER_CHOICE's words."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, base_env

from gosym.hier import schedule
from gosym.hier.measured import TABLE

# flat below 64 KiB, hierarchical from 64 KiB to 16 MiB (exclusive), flat again from 16 MiB
POINTS = ((1024, 9.0, 5.0), (65536, 3.0, 5.0), (1 << 20, 7.0, 8.0), (16 << 20, 9.0, 8.0))
FAKE = {("cpu", "2x2", "loopback"): {"sources": ["-"], "hier": "h", "flat": "f",
                                     "ops": {"all_reduce": POINTS}}}
LB = "loopback"


def test_table_is_what_its_files_say():
    """scripts/hier_table.py --check: every entry is what its results file gives, and every
    file it cites exists."""
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "hier_table.py"), "--check"],
                       capture_output=True, text=True, timeout=120, env=base_env())
    assert p.returncode == 0, p.stdout + p.stderr


def test_entries_cite_existing_files():
    assert TABLE, "the table is empty"
    for key, e in TABLE.items():
        assert e["sources"], key
        for f in e["sources"]:
            assert (REPO / f).is_file(), (key, f)
            assert f.startswith("docs/results/"), (key, f)
        for op, points in e["ops"].items():
            assert op in schedule.OPS, (key, op)
            sizes = [p[0] for p in points]
            assert sizes == sorted(set(sizes)), (key, op, sizes)


@pytest.mark.parametrize("nbytes,want", [
    (0, "flat"), (1, "flat"), (1024, "flat"), (65535, "flat"),   # below and at the first point
    (65536, "hier"), ((1 << 20) - 1, "hier"), (1 << 20, "hier"),  # from a winning point on
    ((16 << 20) - 1, "hier"), (16 << 20, "flat"), (1 << 30, "flat"),  # the last point onwards
])
def test_a_size_takes_the_largest_measured_point_at_or_below_it(nbytes, want):
    assert schedule.choose("cpu", "all_reduce", nbytes, "2x2", table=FAKE, link_key=LB) == want


def test_below_the_smallest_point_its_choice():
    table = {("cpu", "2x2", LB): {**FAKE[("cpu", "2x2", LB)], "ops": {"all_reduce": POINTS[1:]}}}
    assert schedule.choose("cpu", "all_reduce", 1, "2x2", table=table, link_key=LB) == "hier"


@pytest.mark.parametrize("device,op,shape", [
    ("cuda", "all_reduce", "2x2"),  # another device type
    ("cpu", "all_reduce", "2x4"),   # another shape: not carried over
    ("cpu", "all_reduce", "1+2"),
    ("cpu", "broadcast", "2x2"),    # an op the entry has no points for
])
def test_unmeasured_runs_flat(device, op, shape):
    for nbytes in (1, 65536, 1 << 26):
        for link in schedule.LINKS:
            assert schedule.choose(device, op, nbytes, shape, table=FAKE, link_key=link) == "flat"


def test_modes_override_the_table():
    for mode in ("hier", "flat"):
        for nbytes in (1, 65536, 1 << 26):
            assert schedule.choose("cpu", "all_reduce", nbytes, "2x2", mode, FAKE,
                                   link_key=LB) == mode
            assert schedule.choose("cuda", "reduce", nbytes, "9x9", mode, FAKE,
                                   link_key="network") == mode


def test_bad_mode_and_op_are_clear_errors():
    with pytest.raises(ValueError, match="GOSYM_HIER_CHOICE='fast': accepts one of table, "
                                         "hier, flat"):
        schedule.choose("cpu", "all_reduce", 1, "2x2", "fast", link_key=LB)
    with pytest.raises(ValueError, match="no hierarchical schedule to choose for op 'all_to_all'"):
        schedule.choose("cpu", "all_to_all", 1, "2x2", link_key=LB)


def test_the_link_takes_its_own_entry_else_the_others():
    """An op takes the points measured over the group's link; where that link's entry lacks
    the shape or the op, the other link's points (a measured shape says more than none)."""
    net = ((1024, 1.0, 5.0), (1 << 20, 9.0, 5.0))  # hierarchical below 1 MiB, flat from it
    table = {**FAKE, ("cpu", "2x2", "network"): {"sources": ["-"], "hier": "h", "flat": "f",
                                                 "ops": {"all_reduce": net}},
             ("cpu", "2x4", "network"): {"sources": ["-"], "hier": "h", "flat": "f",
                                         "ops": {"broadcast": net}}}
    for nbytes, lb, nw in ((1024, "flat", "hier"), (65536, "hier", "hier"),
                           (1 << 20, "hier", "flat"), (16 << 20, "flat", "flat")):
        assert schedule.choose("cpu", "all_reduce", nbytes, "2x2", table=table, link_key=LB) == lb
        assert schedule.choose("cpu", "all_reduce", nbytes, "2x2", table=table,
                               link_key="network") == nw
    # 2x4: only the network entry, only broadcast: loopback takes it, all_reduce runs flat
    assert schedule.choose("cpu", "broadcast", 4096, "2x4", table=table, link_key=LB) == "hier"
    assert schedule.choose("cpu", "all_reduce", 4096, "2x4", table=table, link_key=LB) == "flat"
    # 2x2's network entry has no broadcast, and neither has loopback's
    assert schedule.choose("cpu", "broadcast", 4096, "2x2", table=table,
                           link_key="network") == "flat"


@pytest.mark.parametrize("boots,setting,want", [
    (["a", "a", "a"], "auto", "loopback"),      # one kernel: hosts simulated on one machine
    (["a", "b", "a"], "auto", "network"),       # two machines
    (["", ""], "auto", "network"),              # unknown: not claimed to be one machine
    (["a", None], "auto", "network"),           # a rank that did not say
    (["a", "b"], "loopback", "loopback"),       # the setting decides where it names a link
    (["a", "a"], "network", "network"),         # shaped namespaces (simhosts.py --link-mbit)
])
def test_link_from_boot_ids(boots, setting, want):
    assert schedule.link(boots, setting) == want


def test_bad_link_is_a_clear_error():
    with pytest.raises(ValueError, match="GOSYM_HIER_LINK='fast': accepts one of auto, "
                                         "loopback, network"):
        schedule.link(["a"], "fast")
    with pytest.raises(ValueError, match="an entry's link is one of"):
        schedule.entry([("f", _report([2, 2], [("g", "all_reduce", 4096, 1.0, {}),
                                               ("x", "all_reduce", 4096, 2.0, {})]))],
                       "g", "x", link_key="lan")


def test_shapes():
    assert schedule.shape([2, 2]) == "2x2"
    assert schedule.shape([1, 1, 1]) == "3x1"
    assert schedule.shape([1, 2]) == "1+2"
    assert schedule.shape([2, 1]) == "2+1"
    with pytest.raises(ValueError, match="at least one rank"):
        schedule.shape([2, 0])


def test_committed_cuda_2x2_choices():
    """Session 26's 2 x 2 H200 (gosym-hier against gosym-flat): flat where the hierarchical
    schedule's three steps lose (below 256 KiB for all_reduce, 1 MiB for all_gather, 4 MiB
    for reduce_scatter: 407 against 234 us at 1 MiB; 16 MiB for broadcast), hierarchical from
    there on; reduce not measured: flat."""
    want = {"all_reduce": 256 << 10, "all_gather_into_tensor": 1 << 20,
            "reduce_scatter_tensor": 4 << 20, "broadcast": 16 << 20}
    for op, first in want.items():
        for link in schedule.LINKS:  # measured over loopback: real hosts take it too
            assert schedule.choose("cuda", op, first - 1, "2x2", link_key=link) == "flat", op
            assert schedule.choose("cuda", op, first, "2x2", link_key=link) == "hier", op
            assert schedule.choose("cuda", op, 1 << 30, "2x2", link_key=link) == "hier", op
    assert schedule.choose("cuda", "reduce", 1 << 26, "2x2", link_key=LB) == "flat"


def _report(hosts, results, device="cpu"):
    report = {"config": {"device": device}, "results": [
        {"backend": b, "op": op, "size": size, "median_us": us, **kw}
        for b, op, size, us, kw in results]}
    if hosts:
        report["hosts"] = hosts
    return report


def test_entry_from_a_report():
    """entry(): the points of both backends, by size; a failed case is left out; the hosts
    from the report, else from the caller; a report of other hosts than said is refused, and
    one that records another link than the entry's."""
    report = _report([2, 2], [
        ("g", "all_reduce", 4096, 10.04, {}), ("x", "all_reduce", 4096, 12.0, {}),
        ("g", "all_reduce", 1024, 5.0, {}), ("x", "all_reduce", 1024, 4.0, {}),
        ("g", "broadcast", 1024, 1.0, {"error": "boom"}), ("x", "broadcast", 1024, 1.0, {}),
        ("g", "all_to_all_single", 1024, 1.0, {}), ("x", "all_to_all_single", 1024, 1.0, {})])
    key, e = schedule.entry([("docs/results/x.json", report)], "g", "x")
    assert key == ("cpu", "2x2", "loopback")
    assert schedule.entry([("f", report)], "g", "x", link_key="network")[0] == ("cpu", "2x2",
                                                                                "network")
    assert e == {"sources": ["docs/results/x.json"], "hier": "g", "flat": "x",
                 "ops": {"all_reduce": ((1024, 5.0, 4.0), (4096, 10.0, 12.0))}}
    del report["hosts"]
    assert schedule.entry([("f", report)], "g", "x", [1, 2])[0] == ("cpu", "1+2", "loopback")
    with pytest.raises(ValueError, match="names no hosts"):
        schedule.entry([("f", report)], "g", "x")
    report["hosts"] = [2, 2]
    with pytest.raises(ValueError, match=r"hosts \[2, 2\] are not \[1, 2\]"):
        schedule.entry([("f", report)], "g", "x", [1, 2])
    report["link"] = "network"  # what gosym.bench records of its group
    assert schedule.entry([("f", report)], "g", "x", link_key="network")[0][2] == "network"
    with pytest.raises(ValueError, match="over a network link, not loopback"):
        schedule.entry([("f", report)], "g", "x")


def test_entry_of_several_runs_takes_the_median():
    """Three runs: each point is the median of theirs, so one disturbed run decides nothing;
    a size one run lacks is left out; runs of other shapes or devices are not one entry."""
    runs = [_report([2, 2], [("g", "all_reduce", 1024, g, {}), ("x", "all_reduce", 1024, x, {}),
                             ("g", "all_reduce", 4096, 1.0, {}), ("x", "all_reduce", 4096, 2.0, {})])
            for g, x in ((5.0, 4.0), (50.0, 4.5), (4.8, 3.0))]
    runs[1]["results"] = runs[1]["results"][:2]  # the second run has no 4 KiB
    _, e = schedule.entry([(f"r{i}", r) for i, r in enumerate(runs)], "g", "x")
    assert e["ops"] == {"all_reduce": ((1024, 5.0, 4.0),)}
    with pytest.raises(ValueError, match="share a device type and shape"):
        schedule.entry([("a", runs[0]), ("b", dict(runs[0], hosts=[1, 2]))], "g", "x")
    with pytest.raises(ValueError, match="share a device type and shape"):
        schedule.entry([("a", runs[0]), ("b", dict(runs[0], config={"device": "cuda"}))],
                       "g", "x")


def test_entry_takes_each_op_from_the_runs_that_measured_it():
    """A later job that measured one op again: that op's points are the median over every
    run of it, the op it did not measure keeps the earlier runs' points (it is not dropped
    for being absent from one report)."""
    def run(ops):
        return _report([2, 2], [(b, op, 1024, us, {}) for op, (g, x) in ops.items()
                                for b, us in (("g", g), ("x", x))])

    early = [run({"all_reduce": (5.0, 9.0), "broadcast": (7.0, 3.0)}),
             run({"all_reduce": (6.0, 9.5), "broadcast": (8.0, 4.0)})]
    later = run({"all_reduce": (50.0, 1.0)})
    _, e = schedule.entry([(f"r{i}", r) for i, r in enumerate([*early, later])], "g", "x")
    assert e["ops"] == {"all_reduce": ((1024, 6.0, 9.0),), "broadcast": ((1024, 7.5, 3.5),)}


def test_all_to_all_single_has_a_schedule_on_host_tensors_only():
    assert "all_to_all_single" in schedule.ops_for("cpu")
    assert "all_to_all_single" not in schedule.ops_for("cuda")
    assert set(schedule.ops_for("cuda")) == set(schedule.OPS) - {"all_to_all_single"}


def test_points_only_from_reports_whose_build_had_the_schedule():
    """A report from before gosym.bench recorded hier_ops (session 30) gives no
    all_to_all_single points (its gosym-hier ran that op flat); one that records it does."""
    def report(hier_ops):
        rows = [{"backend": b, "op": op, "size": 1024, "median_us": us}
                for op in ("all_reduce", "all_to_all_single")
                for b, us in (("gosym-hier", 1.0), ("gosym-flat", 2.0))]
        r = {"config": {"device": "cpu"}, "hosts": [2, 2], "results": rows}
        if hier_ops is not None:
            r["hier_ops"] = hier_ops
        return r

    _, old = schedule.entry([("old.json", report(None))], "gosym-hier", "gosym-flat")
    assert sorted(old["ops"]) == ["all_reduce"]
    _, new = schedule.entry([("new.json", report(schedule.ops_for("cpu")))], "gosym-hier",
                            "gosym-flat")
    assert sorted(new["ops"]) == ["all_reduce", "all_to_all_single"]


def test_entry_over_several_link_rates_takes_the_worst_for_the_hierarchy():
    """worst(): entries of one shape at several link rates make one whose point at each size
    is the rate's where hier / flat was largest, so the choice is hierarchical only where it
    won at every rate; sizes or ops a rate lacks are left out; other backends are refused."""
    slow = {"sources": ["s1", "s2"], "hier": "g", "flat": "x", "ops": {
        "all_reduce": ((1024, 1.0, 4.0), (4096, 2.0, 4.0), (8192, 5.0, 4.0)),
        "broadcast": ((1024, 1.0, 2.0),)}}
    fast = {"sources": ["f1"], "hier": "g", "flat": "x", "ops": {
        "all_reduce": ((1024, 3.0, 4.0), (4096, 6.0, 4.0))}}
    e = schedule.worst([slow, fast])
    assert e == {"sources": ["s1", "s2", "f1"], "hier": "g", "flat": "x",
                 "ops": {"all_reduce": ((1024, 3.0, 4.0), (4096, 6.0, 4.0))}}
    table = {("cpu", "2x2", "network"): e}
    assert schedule.choose("cpu", "all_reduce", 1024, "2x2", table=table,
                           link_key="network") == "hier"  # won at both rates
    assert schedule.choose("cpu", "all_reduce", 4096, "2x2", table=table,
                           link_key="network") == "flat"  # lost at the fast one
    assert schedule.worst([slow]) == slow
    with pytest.raises(ValueError, match="same backends"):
        schedule.worst([slow, dict(fast, flat="gloo")])
