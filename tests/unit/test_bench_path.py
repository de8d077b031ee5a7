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


def test_path_of_tells_relayed_broadcasts_from_other_direct_ops():
    before = {"gpu_ops": 3, "gpu_direct_ops": 2, "gpu_relay_ops": 1}
    assert path_of(before, dict(before, gpu_ops=7, gpu_direct_ops=6, gpu_relay_ops=5)) == "relay"
    assert path_of(before, dict(before, gpu_ops=7, gpu_direct_ops=6, gpu_relay_ops=3)) == "relay+direct"
    assert path_of(before, dict(before, gpu_ops=7, gpu_direct_ops=5, gpu_relay_ops=2)) == "relay+direct+staged"
