"""``tilesplat.bench.ut`` (the 3DGUT item of scripts/gpu_check.py) on the CPU, with the torch
reference as the backend under test (it compiles nothing; the native backends have their own
parity tests): a backend equal to the reference passes the gate and gets a speed ratio, one
whose colours are off fails it and gets none."""

import torch

from tilesplat.bench import ut

CPU = torch.device("cpu")


def test_a_backend_equal_to_the_reference_passes_the_gate():
    res = ut.run_ut_check("torch", n=30, size=16, repeats=1, device=CPU)
    assert res["passed"], res["tensors"]
    assert [t["name"] for t in res["tensors"]][:2] == list(ut.IMAGES)
    assert res["speedup"] is not None and res["speedup"] > 0
    text = ut.format_ut_check(res)
    assert "parity PASS" in text and text.endswith("x")


def test_a_wrong_colour_fails_the_gate(monkeypatch):
    real = ut.rasterization
    calls = []

    def off(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) != 2:  # the reference passes (float32, float64) are the 1st and 3rd
            return out
        return (out[0] * 1.01, *out[1:])  # the colours (and their gradients) 1 % off

    monkeypatch.setattr(ut, "rasterization", off)
    res = ut.run_ut_check("torch", n=30, size=16, repeats=1, device=CPU)
    failed = {t["name"] for t in res["tensors"] if not t["passed"]}
    assert not res["passed"] and "colors" in failed and res["speedup"] is None
    assert "parity FAIL" in ut.format_ut_check(res)
