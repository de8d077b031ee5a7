"""The exception class gosym raises for a group's failures (timeouts, lost peers, a group
shut down): torch.distributed.DistBackendError where torch has it, else RuntimeError, its
base class there, so that callers catching RuntimeError catch it on either."""

from __future__ import annotations

import torch.distributed as dist

DistBackendError = getattr(dist, "DistBackendError", RuntimeError)
