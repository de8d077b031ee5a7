"""Past one host: a gosym group whose ranks span hosts.

gosym's links are abstract Unix sockets and its data planes shared memory, so they reach
the processes of one host (one network namespace) only. Between hosts gosym grows no
transport of its own: it runs the engines people already run there, Gloo for CPU tensors
and NCCL for CUDA tensors, as torch ProcessGroups it creates itself over the group's
store under a prefix of its own.

At creation the ranks publish a host id through the store (hostname, boot id, network
and pid namespaces; GOSYM_HOST_ID overrides it). A group wholly on one host is a plain
ProcessGroupGosym: nothing of this package stays on its path (gosym.factory decides).
Otherwise the group is a HierGroup, the hierarchy UCC's cl/hier and Open MPI's HAN use:

- local: a gosym group over this host's ranks (local index = order of group rank);
- rail l: an inter-host group over the ranks of local index l, one per host that has one
  (rail 0, the hosts' first ranks, is the leaders' group);
- flat: an inter-host group over every rank, for what needs any pair (send/recv across
  hosts, all_to_all, gather, scatter), and for the ops that the choice (schedule) runs flat.

Gloo's inner groups are created with the group (their construction is collective); NCCL's
at the first CUDA op that needs them (theirs is not). They are shut down with the group.

The modules, by job:

- hosts: host detection (host_id, exchange) and the one-host group it promises (linked);
- tensors: tensors as the inter-host engines take them, a reduction split into its steps;
- runner: the thread that runs a HierGroup's host-side ops in post order;
- watch: the ranks' watch on each other around a ring (a rank that exits is named at once);
- lifetime: HierBase, a HierGroup's creation, inner groups, posting of ops, shutdown, and
  what a failure leaves (the lost ranks named);
- algorithms: HierAlgorithms, the paths between hosts (the leaders, the rails) and the flat
  group's, and the choice between them;
- schedule: that choice per op, size and shape (GOSYM_HIER_CHOICE, the table of
  measurements in measured);
- group: HierGroup, its ops as torch calls them.
"""

from __future__ import annotations

from . import schedule
from .group import HierGroup
from .hosts import HOST_ENV, exchange, host_id, linked

# The name under which the choice table's digest travels with the GOSYM_HIER_* settings.
TABLE_KEY = "the choice table (gosym.hier.measured) digest"

__all__ = ["HOST_ENV", "TABLE_KEY", "HierGroup", "exchange", "host_id", "linked", "schedule"]
