"""Host detection's id (gosym.hier.hosts.host_id): what GOSYM_HOST_ID makes of it, the
per-rank form (ranks-per-host:K) that lets one environment split a job into hosts (torch's
own suite spawns its ranks with one), and the refusal of a bad value."""

from __future__ import annotations

import pytest

from gosym.hier.hosts import host_id


def test_detected_hosts_differ_from_any_set_id(monkeypatch):
    monkeypatch.delenv("GOSYM_HOST_ID", raising=False)
    detected = host_id(3)
    assert detected == host_id(0)  # one process, one host, whatever the rank
    monkeypatch.setenv("GOSYM_HOST_ID", "a")
    assert host_id(3) == host_id(0) == "GOSYM_HOST_ID=a" != detected


@pytest.mark.parametrize("k", [1, 2, 3])
def test_ranks_per_host_puts_consecutive_global_ranks_together(monkeypatch, k):
    monkeypatch.setenv("GOSYM_HOST_ID", f"ranks-per-host:{k}")
    ids = [host_id(g) for g in range(7)]
    for g in range(7):
        for h in range(7):
            assert (ids[g] == ids[h]) == (g // k == h // k), (k, g, h, ids)


@pytest.mark.parametrize("value", ["ranks-per-host:", "ranks-per-host:0", "ranks-per-host:x"])
def test_a_bad_ranks_per_host_is_refused(monkeypatch, value):
    monkeypatch.setenv("GOSYM_HOST_ID", value)
    with pytest.raises(ValueError, match="ranks-per-host takes a whole number"):
        host_id(0)


def test_ranks_per_host_needs_the_global_rank(monkeypatch):
    monkeypatch.setenv("GOSYM_HOST_ID", "ranks-per-host:2")
    with pytest.raises(ValueError, match="knows its global ranks"):
        host_id()
