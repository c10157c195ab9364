"""Releasing a compilation's freed memory (``ms_optim.release_freed_memory``, ``ms_optim._memory``).

Checked: freed heap pages really leave the resident set (measured in ``/proc/self/status``), nothing
that is in use changes, a wrapped cell releases once per compiled phase and computes what the plain
cell computes, and ``ModelThor``'s training cell is wrapped in both its loops.
"""
from __future__ import annotations

import ctypes

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from support.model_data import BATCH, ce_loss, sample_data, sample_dataset, thor_mlp

import ms_optim
from ms_optim import _memory
from ms_optim._thor.model import ModelThor

BLOCK = 1024          # bytes: far below glibc's mmap threshold, so the blocks live in the heap
BLOCKS = 160 * 1024   # 160 MiB in all


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_freed_heap_pages_leave_the_resident_set_and_live_blocks_stay():
    if _memory._malloc_trim() is None:  # not glibc: documented no-op
        assert ms_optim.release_freed_memory() is False
        return
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    ms_optim.release_freed_memory()
    before = _rss_mib()
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for address in blocks:
        ctypes.memset(address, 7, BLOCK)
    keep = blocks[-1]  # the top block stays in use: glibc cannot shrink the heap from its end by itself
    for address in blocks[:-1]:
        libc.free(address)
    freed_but_resident = _rss_mib()
    assert freed_but_resident - before > 100, (before, freed_but_resident)
    assert ms_optim.release_freed_memory() is True
    after = _rss_mib()
    assert freed_but_resident - after > 100, (freed_but_resident, after)
    assert ctypes.string_at(keep, BLOCK) == b"\x07" * BLOCK  # a block in use is untouched
    libc.free(keep)


class _Affine(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 2, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        return self.dense(x) * 2.0


def test_wrapped_cell_releases_once_per_phase_and_computes_the_same(monkeypatch):
    ms.set_context(mode=ms.GRAPH_MODE)
    calls = []
    monkeypatch.setattr(_memory, "release_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(_memory, "_peak_rss_bytes", lambda: 1 << 30)  # a peak that does not move
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    want = np.arange(6, dtype=np.float64).reshape(2, 3).sum(axis=1, keepdims=True) * 2.0 * np.ones((1, 2))
    cell = _memory.release_after_compile(_Affine())
    assert _memory.release_after_compile(cell) is cell  # wrapping twice changes nothing
    for _ in range(3):
        np.testing.assert_allclose(cell(x).asnumpy(), want, rtol=1e-6)
    assert len(calls) == 1
    cell.phase = "other"
    np.testing.assert_allclose(cell(x).asnumpy(), want, rtol=1e-6)
    assert len(calls) == 2
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_wrapped_cell_releases_again_while_the_peak_climbs(monkeypatch):
    ms.set_context(mode=ms.GRAPH_MODE)
    calls = []
    monkeypatch.setattr(_memory, "release_freed_memory", lambda: calls.append(1) or True)
    step = _memory.REGROWTH_BYTES
    # the peak before each call's release check: compiled, then two climbs (one short of the threshold),
    # then settled
    peaks = iter([10 * step, 10 * step + step // 2, 11 * step, 11 * step, 13 * step, 13 * step, 13 * step])
    monkeypatch.setattr(_memory, "_peak_rss_bytes", lambda: next(peaks))
    x = Tensor(np.ones((2, 3), np.float32))
    cell = _memory.release_after_compile(_Affine())
    released_after = []
    for _ in range(7):
        np.testing.assert_allclose(cell(x).asnumpy(), np.full((2, 2), 6.0), rtol=1e-6)
        released_after.append(len(calls))
    # call 1: compiled; call 3: 1 threshold above call 1's peak; call 5: 2 above call 3's; never again
    assert released_after == [1, 1, 2, 2, 3, 3, 3]
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_peak_rss_is_read_in_bytes():
    peak = _memory._peak_rss_bytes()
    if _memory.resource is None:
        assert peak == 0
    else:  # this process has loaded MindSpore: far above 64 MiB, far below 1 TiB
        assert 64 << 20 < peak < 1 << 40


def test_model_thor_releases_after_compiling_in_both_loops(monkeypatch):
    ms.set_context(mode=ms.GRAPH_MODE)
    calls = []
    monkeypatch.setattr(_memory, "release_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(_memory, "_peak_rss_bytes", lambda: 1 << 30)  # a peak that does not move
    x, y = sample_data()
    for sink in (True, False):
        calls.clear()
        net, opt = thor_mlp(frequency=2)
        model = ModelThor(net, ce_loss(), opt)
        before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
        model.train(2, sample_dataset(x, y, BATCH), dataset_sink_mode=sink)
        assert model._train_network._ms_optim_releases == {"train"}
        assert len(calls) == 1, sink
        assert any(not np.array_equal(p.asnumpy(), before[p.name]) for p in net.trainable_params())
    ms.set_context(mode=ms.PYNATIVE_MODE)
