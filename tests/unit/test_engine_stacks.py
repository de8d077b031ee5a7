"""gosym._lib.engine_stacks: every goroutine's stack, for hang reports (the fuzzer prints it
with GOSYM_FUZZ_STACKS_S)."""

import threading

from gosym import _lib


def test_engine_stacks_shows_a_waiting_goroutine():
    # at least the goroutine of this very call, named by its export
    text = _lib.engine_stacks()
    assert text.startswith("goroutine "), text[:200]
    assert "gosym_debug_stacks" in text, text[:2000]


def test_engine_stacks_from_several_threads_at_once():
    out = []
    ts = [threading.Thread(target=lambda: out.append(_lib.engine_stacks())) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(out) == 4 and all("goroutine " in s for s in out)
