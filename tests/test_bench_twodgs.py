"""``tilesplat.bench.twodgs`` (the 2DGS item of scripts/gpu_check.py) on the CPU: the cpu
backend passes the gate against the reference and gets a speed ratio; a backend whose
gradients are off fails it and gets none."""

import torch

from tilesplat.bench import twodgs


def test_the_cpu_backend_passes_the_gate():
    res = twodgs.run_twodgs_check("cpu", n=30, size=16, repeats=1, device=torch.device("cpu"))
    assert res["passed"], res["tensors"]
    assert [t["name"] for t in res["tensors"]][:5] == list(twodgs.IMAGES)
    assert res["speedup"] is not None and res["speedup"] > 0
    text = twodgs.format_twodgs_check(res)
    assert "parity PASS" in text and "x" in text.split("ms, ")[-1]


def test_a_wrong_gradient_fails_the_gate(monkeypatch):
    real = twodgs.rasterization_2dgs

    def off(*args, backend, **kwargs):
        out = real(*args, backend=backend, **kwargs)
        if backend == "torch":
            return out
        return (out[0] * 1.01, *out[1:])  # the colours (and their gradients) 1 % off

    monkeypatch.setattr(twodgs, "rasterization_2dgs", off)
    res = twodgs.run_twodgs_check("cpu", n=30, size=16, repeats=1, device=torch.device("cpu"))
    failed = {t["name"] for t in res["tensors"] if not t["passed"]}
    assert not res["passed"] and "colors" in failed and res["speedup"] is None
    assert "parity FAIL" in twodgs.format_twodgs_check(res)
