"""The items of scripts/gpu_check.py that gate a native backend against the torch reference
(``tilesplat.bench.ut``: 3DGUT, ``tilesplat.bench.twodgs``: 2DGS, both on
``bench/reference_gate.py``), on the CPU with the torch reference as the backend under test
(it compiles nothing; the native backends have their own parity tests): a backend equal to
the reference passes the gate and gets a speed ratio, one whose colours are off fails it and
gets none."""

import pytest
import torch

from tilesplat.bench import twodgs, ut

CPU = torch.device("cpu")
# module, its check, its formatter, the rasterization it calls (monkeypatched below)
ITEMS = {
    "3dgut": (ut, ut.run_ut_check, ut.format_ut_check, "rasterization"),
    "2dgs": (twodgs, twodgs.run_twodgs_check, twodgs.format_twodgs_check,
             "rasterization_2dgs"),
}


@pytest.mark.parametrize("item", sorted(ITEMS))
def test_a_backend_equal_to_the_reference_passes_the_gate(item):
    module, check, fmt, _ = ITEMS[item]
    res = check("torch", n=30, size=16, repeats=1, device=CPU)
    assert res["passed"], res["tensors"]
    n_images = len(module.IMAGES)
    assert [t["name"] for t in res["tensors"]][:n_images] == list(module.IMAGES)
    assert [t["name"] for t in res["tensors"]][n_images:] == [f"v_{x}" for x in module.LEAVES]
    assert res["speedup"] is not None and res["speedup"] > 0
    text = fmt(res)
    assert "parity PASS" in text and text.endswith("x")


@pytest.mark.parametrize("item", sorted(ITEMS))
def test_a_wrong_colour_fails_the_gate(item, monkeypatch):
    module, check, fmt, render = ITEMS[item]
    real = getattr(module, render)
    calls = []

    def off(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) != 2:  # the reference passes (float32, float64) are the 1st and 3rd
            return out
        return (out[0] * 1.01, *out[1:])  # the colours (and their gradients) 1 % off

    monkeypatch.setattr(module, render, off)
    res = check("torch", n=30, size=16, repeats=1, device=CPU)
    failed = {t["name"] for t in res["tensors"] if not t["passed"]}
    assert not res["passed"] and "colors" in failed and res["speedup"] is None
    assert "parity FAIL" in fmt(res)
