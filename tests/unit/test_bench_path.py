"""gosym.bench's per-case path: which CUDA path the ops took, read off the counters' growth."""

from gosym.bench import path_of


def test_path_of_names_the_paths_taken():
    before = {"gpu_ops": 10, "gpu_direct_ops": 2, "gpu_ll_moves": 5, "gpu_paced_all_to_all": 0,
              "gpu_algo_twoshot": 1, "gpu_algo_oneshot": 4}
    assert path_of(before, dict(before, gpu_ops=14, gpu_ll_moves=9)) == "ll"
    assert path_of(before, dict(before, gpu_ops=13, gpu_direct_ops=5)) == "direct"
    assert path_of(before, dict(before, gpu_ops=13)) == "staged"
    assert path_of(before, dict(before, gpu_ops=14, gpu_direct_ops=4, gpu_algo_twoshot=5)) == "direct+staged (twoshot)"
    assert path_of(before, before) == "none"
    assert path_of(before, dict(before, gpu_ops=13, gpu_direct_ops=5, gpu_ce_beside=3)) == "direct (beside)"
    pdl = dict(before, gpu_dependent_launch=True)
    assert path_of(pdl, dict(pdl, gpu_ops=14, gpu_ll_moves=9)) == "ll (pdl)"
    off = dict(before, gpu_dependent_launch=False)
    assert path_of(off, dict(off, gpu_ops=14, gpu_ll_moves=9)) == "ll"


def test_path_of_tells_relayed_broadcasts_from_other_direct_ops():
    before = {"gpu_ops": 3, "gpu_direct_ops": 2, "gpu_relay_ops": 1}
    assert path_of(before, dict(before, gpu_ops=7, gpu_direct_ops=6, gpu_relay_ops=5)) == "relay"
    assert path_of(before, dict(before, gpu_ops=7, gpu_direct_ops=6, gpu_relay_ops=3)) == "relay+direct"
    assert path_of(before, dict(before, gpu_ops=7, gpu_direct_ops=5, gpu_relay_ops=2)) == "relay+direct+staged"


def test_cuda_cases_read_the_path_counters():
    """On CUDA the bench reads gosym's path counters around each case. Its device is a
    torch.device("cuda", rank), which never equals the string "cuda": compared with it, every
    CUDA row's path was left out (sessions 32-35's tables had an empty path column)."""
    import types

    import torch

    from gosym.bench import Bench

    b = Bench.__new__(Bench)
    b.args = types.SimpleNamespace(device="cuda")
    b.device = torch.device("cuda", 1)
    counters = {"gpu_ops": 3, "gpu_direct_ops": 2, "gpu_algo_twoshot": 1, "completed": 9}
    b.gosym = types.SimpleNamespace(stats=lambda group: dict(counters))
    b.groups = {"gosym": object(), "nccl": object()}
    assert b._path_counters("gosym") == {"gpu_ops": 3, "gpu_direct_ops": 2, "gpu_algo_twoshot": 1}
    assert b._path_counters("nccl") is None
    b.args.device = "cpu"
    assert b._path_counters("gosym") is None
