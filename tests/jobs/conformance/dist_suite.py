"""PyTorch's backend test suite (DistributedTest._DistTestBase) as a test class whose ranks
run a chosen backend under a reference backend's test selection.

The suite (torch/testing/_internal/distributed/distributed_test.py, shipped in the wheel)
reads the backend's name from $BACKEND once, at import, and its decorators decide there
which tests apply (``BACKEND != "gloo"`` skips, ``DistTestCases`` feature sets). This module
is imported with $BACKEND set to the reference ("gloo" on CPU, "nccl" on CUDA), so the
selection is exactly the reference's. In each rank, before the suite's own ``_run`` creates
the process group, the suite's ``BACKEND`` becomes ``SelectedAs(runtime, reference)``: a str
equal to the runtime backend's name ("gosym"), which the process groups are created with
(init_process_group, new_group, get_backend and Backend() checks all see "gosym"), that also
compares equal to the reference name, so the few test bodies that branch on the name
(``if BACKEND == "gloo"``: which device to use) take the reference's branch.

Ranks are forked from a forkserver that preloaded torch and this module (the suite's import
costs seconds, once); gosym is imported in the rank after the fork, since its engine's
threads do not survive one. A forkserver child inherits the server's environment, so each
rank gets the test's environment (TEMP_DIR and the rest, set per test by the suite) passed
with its arguments.
"""

from __future__ import annotations

import os

# The reference backend's selection: the suite reads $BACKEND at import. The runner sets
# these before importing this module (and the forkserver inherits them); defaults let a
# rank's unpickling import it too.
REFERENCE = os.environ.setdefault("BACKEND", "gloo")
RUNTIME = os.environ.get("GOSYM_CONFORMANCE_RUNTIME", REFERENCE)
os.environ.setdefault("WORLD_SIZE", "2")

import torch  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402
from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402

# The port a few tests rendezvous on besides the group's file:// store (MASTER_PORT + 1; torch
# fixes MASTER_PORT at 29500): the runner picks a free one, so that runs at once do not meet.
if os.environ.get("GOSYM_CONFORMANCE_PORT"):
    dt.MASTER_PORT = int(os.environ["GOSYM_CONFORMANCE_PORT"])

# Lists of the backends whose profiling the suite checks (event names "<backend>:<op>").
PROFILING_LISTS = ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                   "SEND_RECV_PROFILING_SUPPORTED_BACKENDS")


class SelectedAs(str):
    """The runtime backend's name that also compares equal to the reference's (see the
    module doc). Its hash is the runtime name's: set lookups (the suite's feature sets, used
    only at import) see the runtime name; str methods (lower(), upper()) return plain strs."""

    __slots__ = ("reference",)

    def __new__(cls, runtime, reference):
        s = super().__new__(cls, runtime)
        s.reference = reference
        return s

    def __eq__(self, other):
        return str.__eq__(self, other) or other == self.reference

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _as_runtime():
    """In a rank: loads the runtime backend and points the suite at it."""
    if RUNTIME == REFERENCE:
        return
    if RUNTIME == "gosym":
        import gosym  # noqa: F401 - registers the backend
    dt.BACKEND = SelectedAs(RUNTIME, REFERENCE)
    for name in PROFILING_LISTS:
        lst = getattr(dt, name)
        if RUNTIME not in lst:
            lst.append(RUNTIME)


class TestDistBackendConformance(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
    """The suite's tests, ranks forked from a preloaded forkserver."""

    def setUp(self):
        super().setUp()
        self._start_processes(tmp.get_context("forkserver").Process)

    def _start_processes(self, proc):
        # The rank's environment travels with its arguments (see the module doc): the
        # suite sets TEMP_DIR per test in this process.
        env = dict(os.environ)
        self.processes = []
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = tmp.Pipe()
            process = proc(target=self.__class__._run, name=f"process {rank}",
                           args=(rank, self._current_test_name(), self.file_name, child_conn),
                           kwargs={"env": env})
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, env=None, **kwargs):
        if env:
            os.environ.update(env)
        _as_runtime()
        super()._run(rank, test_name, file_name, pipe, **kwargs)


def suite_tests():
    """The suite's test method names, sorted."""
    return sorted(n for n in dir(TestDistBackendConformance) if n.startswith("test_"))


def statically_skipped(name):
    """The reason a test is skipped by a decorator evaluated at import, else None."""
    fn = getattr(TestDistBackendConformance, name)
    if getattr(fn, "__unittest_skip__", False):
        return getattr(fn, "__unittest_skip_why__", "skipped")
    return None


def preload():
    """Starts the forkserver with torch and this module preloaded; on CUDA with torch alone:
    the suite's import initializes CUDA (its decorators query the devices), which no forked
    rank could use, so there each rank imports the suite itself."""
    ctx = tmp.get_context("forkserver")
    suite = [] if REFERENCE == "nccl" else [__name__]
    ctx.set_forkserver_preload(["torch", "torch.distributed", *suite])
    return ctx
