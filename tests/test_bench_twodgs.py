"""``tilesplat.bench.twodgs`` (the 2DGS item of scripts/gpu_check.py) on the CPU, with the
torch reference as the backend under test (it compiles nothing; the native backends have their
own parity tests): a backend equal to the reference passes the gate and gets a speed ratio,
one whose colours are off fails it and gets none."""

import torch

from tilesplat.bench import twodgs

CPU = torch.device("cpu")


def test_a_backend_equal_to_the_reference_passes_the_gate():
    res = twodgs.run_twodgs_check("torch", n=30, size=16, repeats=1, device=CPU)
    assert res["passed"], res["tensors"]
    assert [t["name"] for t in res["tensors"]][:5] == list(twodgs.IMAGES)
    assert res["speedup"] is not None and res["speedup"] > 0
    text = twodgs.format_twodgs_check(res)
    assert "parity PASS" in text and text.endswith("x")


def test_a_wrong_gradient_fails_the_gate(monkeypatch):
    real = twodgs.rasterization_2dgs
    calls = []

    def off(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) != 2:  # the reference passes (float32, float64) are the 1st and 3rd
            return out
        return (out[0] * 1.01, *out[1:])  # the colours (and their gradients) 1 % off

    monkeypatch.setattr(twodgs, "rasterization_2dgs", off)
    res = twodgs.run_twodgs_check("torch", n=30, size=16, repeats=1, device=CPU)
    failed = {t["name"] for t in res["tensors"] if not t["passed"]}
    assert not res["passed"] and "colors" in failed and res["speedup"] is None
    assert "parity FAIL" in twodgs.format_twodgs_check(res)
