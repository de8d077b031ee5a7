"""gosym._lib.engine_stacks: every goroutine's stack, for hang reports (the fuzzer prints it
with GOSYM_FUZZ_STACKS_S)."""

import ctypes
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


def test_read_string_grows_past_the_first_buffer():
    # a (buf, cap, *len) call that fails while the buffer is short, as copyOut does, and whose
    # text grows between calls (a goroutine dump does): read_string retries until it fits
    calls = []

    def fn(buf, cap, n):
        text = b"x" * (5000 + 100 * len(calls))
        calls.append(cap)
        n._obj.value = len(text)
        if cap < len(text) + 1:
            return 1  # short: the real call fails and reports the length it needs
        ctypes.memmove(buf, text + b"\0", len(text) + 1)
        return 0

    text = _lib.read_string(fn)
    assert text == "x" * len(text) and len(text) >= 5100, len(text)
    assert calls[0] == 4096 and len(calls) >= 2

