"""gosym._torchrun.run_job, how the benchmark modules run their torchrun jobs: a job past its
limit, or whose launcher gets SIGTERM (`timeout` on a device step), ends as a whole, its
ranks too, though torchrun starts each rank in a session of its own (out of reach of a signal
to torchrun's process group). A stand-in for torchrun plays that part here."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from gosym import _torchrun

# torchrun's shape: a rank in a session of its own, stopped by the launcher on SIGTERM; the rank
# writes its pid to the file named by argv[1] and sleeps
FAKE_TORCHRUN = textwrap.dedent("""
    import signal, subprocess, sys, time
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)
    open(sys.argv[1], "w").write(str(rank.pid))
    def stop(*_):
        rank.terminate()
        rank.wait()
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("launched", flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for this purpose (its parent has not reaped it yet)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def _wait_gone(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _rank_pid(path, within=20.0) -> int:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("the stand-in never started its rank")


def test_a_job_past_its_limit_ends_with_its_ranks(tmp_path):
    pidfile = tmp_path / "rank.pid"
    t0 = time.monotonic()
    res = _torchrun.run_job([sys.executable, "-c", FAKE_TORCHRUN, str(pidfile)], dict(os.environ), 2.0)
    took = time.monotonic() - t0
    assert res.returncode == 124, res
    assert "launched" in res.stdout
    assert took < 30, f"run_job took {took:.1f}s to stop the job"
    assert _wait_gone(_rank_pid(pidfile), 10), "the rank outlived its job"


def test_sigterm_to_the_launcher_stops_the_job(tmp_path):
    pidfile = tmp_path / "rank.pid"
    launcher = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(_torchrun.__file__))!r})
        from gosym import _torchrun
        _torchrun.run_job([sys.executable, "-c", {FAKE_TORCHRUN!r}, {str(pidfile)!r}], dict(os.environ), 600.0)
    """)
    p = subprocess.Popen([sys.executable, "-c", launcher])
    rank = _rank_pid(pidfile)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert _wait_gone(rank, 10), "the rank outlived its launcher's SIGTERM"
