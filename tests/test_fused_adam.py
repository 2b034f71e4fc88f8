"""``optimizers.fused_adam.FusedAdam``: the bits of ``torch.optim.Adam(fused=True)`` on a short
path, states that load either way, and no ``torch._dynamo`` import."""

import subprocess
import sys

import pytest
import torch

from tilesplat.optimizers.fused_adam import FusedAdam


def _pair(shapes, lr=3e-3, betas=(0.7, 0.99), eps=1e-15, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ours = [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    groups = lambda ps: [{"params": [p], "lr": lr * (i + 1), "name": f"p{i}"}  # noqa: E731
                         for i, p in enumerate(ps)]
    return (ours, FusedAdam(groups(ours), lr=lr, betas=betas, eps=eps),
            ref, torch.optim.Adam(groups(ref), lr=lr, betas=betas, eps=eps, fused=True))


def _grads(ps, step, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=dtype) * (10.0 ** (step % 5 - 2))


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), (a - b).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_steps_are_torch_fused_bits(dtype):
    shapes = [(97, 3), (97,), (97, 15, 3), (0, 4)]  # odd sizes, and an empty parameter
    ours, opt, ref, ref_opt = _pair(shapes, dtype=dtype)
    for step in range(12):
        _grads(ours, step, dtype)
        _grads(ref, step, dtype)
        if step == 5:  # a parameter without a gradient this step keeps its state
            ours[1].grad = ref[1].grad = None
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        for a, b in zip(ours, ref, strict=True):
            _same(a.detach(), b.detach())
            assert a.grad is None
    for a, b in zip(ours, ref, strict=True):
        sa, sb = opt.state[a], ref_opt.state[b]
        assert sorted(sa) == sorted(sb) == ["exp_avg", "exp_avg_sq", "step"]
        for key in sa:
            _same(sa[key], sb[key])
    assert float(opt.state[ours[1]]["step"]) == 11.0


def test_found_inf_skips_the_step_as_torch_does():
    ours, opt, ref, ref_opt = _pair([(33, 3)])
    for step, flag in enumerate([0.0, 1.0, 0.0]):
        _grads(ours, step)
        _grads(ref, step)
        for o in (opt, ref_opt):
            o.found_inf = torch.tensor(flag)
            o.step()
            del o.found_inf
        _same(ours[0].detach(), ref[0].detach())
        _same(opt.state[ours[0]]["step"], ref_opt.state[ref[0]]["step"])
    assert float(opt.state[ours[0]]["step"]) == 2.0


def test_state_dicts_load_either_way_and_keep_the_bits():
    ours, opt, ref, ref_opt = _pair([(41, 4), (41,)])
    for step in range(3):
        _grads(ours, step)
        _grads(ref, step)
        opt.step()
        ref_opt.step()
    # swap the states: each optimizer continues from the other's dict
    sd_ours, sd_ref = opt.state_dict(), ref_opt.state_dict()
    assert sd_ours["param_groups"] == sd_ref["param_groups"]
    opt.load_state_dict(sd_ref)
    ref_opt.load_state_dict(sd_ours)
    for step in range(3, 6):
        _grads(ours, step)
        _grads(ref, step)
        opt.step()
        ref_opt.step()
        for a, b in zip(ours, ref, strict=True):
            _same(a.detach(), b.detach())


def test_zero_grad_without_set_to_none_zeros():
    ours, opt, _, _ = _pair([(5, 3)])
    _grads(ours, 0)
    opt.zero_grad(set_to_none=False)
    assert ours[0].grad is not None and not bool(ours[0].grad.any())


def test_a_scheduler_drives_it():
    ours, opt, _, _ = _pair([(5, 3)], lr=1e-2)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    _grads(ours, 0)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-3)


def test_a_rate_tensor_takes_torchs_own_step():
    p = torch.randn(7, 3, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    opt = FusedAdam([{"params": [p], "lr": torch.tensor(1e-2)}])
    ref = torch.optim.Adam([{"params": [q], "lr": torch.tensor(1e-2)}], fused=True)
    for step in range(3):
        _grads([p], step)
        _grads([q], step)
        opt.step()
        ref.step()
    _same(p.detach(), q.detach())


def test_no_dynamo_import():
    code = (
        "import sys, torch\n"
        "from tilesplat.optimizers.fused_adam import FusedAdam\n"
        "p = torch.randn(4, 3, requires_grad=True)\n"
        "opt = FusedAdam([{'params': [p], 'lr': 1e-3}])\n"
        "p.sum().backward(); opt.step(); opt.zero_grad()\n"
        "opt.load_state_dict(opt.state_dict())\n"
        "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_step_hooks_run_once_and_the_profiler_sees_the_step():
    """``step`` skips torch's wrapper only while it has nothing to do: hooks registered on
    the optimizer or on every optimizer run once per step, and a profiler records the
    step's range."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    ours, opt, ref, ref_opt = _pair([(9, 3)])
    assert not getattr(FusedAdam.step, "hooked", False)
    calls = []
    handles = [opt.register_step_pre_hook(lambda *a: calls.append("pre")),
               opt.register_step_post_hook(lambda *a: calls.append("post")),
               register_optimizer_step_pre_hook(lambda *a: calls.append("global pre")),
               register_optimizer_step_post_hook(lambda *a: calls.append("global post"))]
    try:
        _grads(ours, 0)
        _grads(ref, 0)
        opt.step()
        ref_opt.step()
        assert calls.count("pre") == calls.count("post") == 1
        assert calls.count("global pre") == calls.count("global post") == 2  # and torch's
        _same(ours[0].detach(), ref[0].detach())
    finally:
        for h in handles:
            h.remove()
    calls.clear()
    _grads(ours, 1)
    opt.step()
    assert calls == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _grads(ours, 2)
        opt.step()
    assert any(e.key == "Optimizer.step#FusedAdam.step" for e in prof.key_averages())
