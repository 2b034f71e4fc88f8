"""tilesplat.distributed on 2 CPU processes with gloo, on 127.0.0.1: gsplat's collectives
with uneven and zero splits, forward and backward, and a rank that raises ending the job.

Each test spawns 2 ranks (``torch.multiprocessing``) that check their own results and raise
on a mismatch; the parent waits a bounded time and ends every rank by its PID.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import tilesplat.distributed as tdist

WORLD = 2
TIMEOUT_S = 300  # a bound, not a speed check: 120 s ran out on a machine loaded 4x over


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))


def _rank(rank: int, port: int, target, *args) -> None:
    """One rank: ``target(rank, port, *args)``; a rank that returns ends its process at once
    (``tdist.end_rank_process``: gloo's worker threads can abort Python's finalization)."""
    target(rank, port, *args)
    tdist.end_rank_process()


def _spawn(target, *args) -> None:
    """Runs target(rank, port, *args) on WORLD ranks; raises the first rank's error; never
    waits more than TIMEOUT_S; every rank is ended by its PID."""
    port = _free_port()
    ctx = torch.multiprocessing.spawn(_rank, args=(port, target, *args), nprocs=WORLD,
                                      join=False)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks still running after {TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, 9)
            p.join(5)


def _ints(rank: int) -> None:
    assert tdist.all_gather_int32(WORLD, 10 + rank, device=torch.device("cpu")) == [10, 11]
    got = tdist.all_gather_int32(WORLD, torch.tensor(7 * rank))
    assert [int(g) for g in got] == [0, 7] and all(isinstance(g, torch.Tensor) for g in got)
    # rank r sends 100 * r + dst to rank dst
    got = tdist.all_to_all_int32(WORLD, [100 * rank, 100 * rank + 1],
                                 device=torch.device("cpu"))
    assert got == [rank, 100 + rank], got


def _rows(rank: int, n: int, width: int) -> torch.Tensor:
    base = torch.arange(n * width, dtype=torch.float64).reshape(n, width)
    return base + 1000.0 * rank


def _gather(rank: int) -> None:
    """Uneven rows: rank 0 has 3, rank 1 has 0 (then 1); gradients come back to each rank."""
    for counts in ((3, 0), (3, 1)):
        a = _rows(rank, counts[rank], 2).requires_grad_(True)
        b = (_rows(rank, counts[rank], 6) * -1).reshape(counts[rank], 2, 3)
        b.requires_grad_(True)
        ga, gb = tdist.all_gather_tensor_list(WORLD, [a, b])
        want_a = torch.cat([_rows(r, counts[r], 2) for r in range(WORLD)])
        want_b = torch.cat([-_rows(r, counts[r], 6) for r in range(WORLD)]).reshape(-1, 2, 3)
        assert torch.equal(ga, want_a) and torch.equal(gb, want_b)
        # every rank weighs the gathered rows by (1 + its rank): a's gradient on each
        # rank is the sum over ranks, 1 + 2 = 3
        ((ga.sum() + gb.sum()) * (1 + rank)).backward()
        assert torch.equal(a.grad, torch.full_like(a, 3.0))
        assert torch.equal(b.grad, torch.full_like(b, 3.0))


def _all_to_all(rank: int, given: bool) -> None:
    """Rank 0 sends 2 rows to itself and 0 to rank 1; rank 1 sends 1 to rank 0, 3 to itself;
    float rows and int64 ids travel together (one exchange per dtype, exact)."""
    splits = [[2, 0], [1, 3]][rank]
    n = sum(splits)
    x = _rows(rank, n, 3).requires_grad_(True)
    ids = torch.arange(n, dtype=torch.int64) + 10 * rank
    out_splits = [[2, 1], [0, 3]][rank] if given else None
    gx, gids = tdist.all_to_all_tensor_list(WORLD, [x, ids[:, None]], splits, out_splits)
    if rank == 0:
        want = torch.cat([_rows(0, 3, 3)[:2], _rows(1, 4, 3)[:1]])
        want_ids = torch.tensor([0, 1, 10])
    else:
        want = _rows(1, 4, 3)[1:]
        want_ids = torch.tensor([11, 12, 13])
    assert torch.equal(gx, want), (gx, want)
    assert torch.equal(gids[:, 0], want_ids)
    (gx * (1 + rank)).sum().backward()
    # each row's gradient is (1 + the rank it went to)
    dest = torch.cat([torch.full((s,), 1.0 + r) for r, s in enumerate(splits)])
    assert torch.equal(x.grad, dest[:, None].expand(n, 3).double())


def _collectives(rank: int, port: int) -> None:
    """One job for all the collectives (starting ranks costs seconds each)."""
    _init(rank, port)
    try:
        _ints(rank)
        _gather(rank)
        _all_to_all(rank, given=False)
        _all_to_all(rank, given=True)
    finally:
        dist.destroy_process_group()


def test_collectives_with_uneven_and_zero_splits_and_their_gradients():
    _spawn(_collectives)


def _fails(local_rank: int, world_rank: int, world_size: int, args) -> None:
    if world_rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    dist.barrier()  # rank 0 would wait here for ever without the launcher ending it


def test_a_rank_that_raises_ends_the_job_with_its_error(monkeypatch):
    monkeypatch.setenv("TILESPLAT_NPROC", "2")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    t0 = time.monotonic()
    with pytest.raises(Exception, match="rank 1 broke on purpose"):
        tdist.cli(_fails, None)
    assert time.monotonic() - t0 < 60


def test_single_process_and_bad_arguments():
    x = [torch.ones(2, 3)]
    assert tdist.all_gather_tensor_list(1, x) is x
    assert tdist.all_to_all_int32(1, [5]) == [5]
    with pytest.raises(RuntimeError, match="process group"):
        tdist.all_gather_int32(2, 1, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="world_size"):
        tdist.all_gather_int32(0, 1)


def _sharded_rendering(rank: int, port: int) -> None:
    """Rank 0 holds 6 Gaussians and 1 camera, rank 1 holds 7 Gaussians and 2 cameras; each
    renders its own cameras with everyone's Gaussians and must match one process rendering
    all 13 into all 3 (images 1e-6, gradients rel 1e-5), packed and unpacked, with the same
    tight tile lists (the intersections of its cameras; gsplat's box lists hold more)."""
    import tilesplat
    from helpers import cameras, random_gaussians
    from tilesplat.rendering._pipeline import box_tile_lists

    _init(rank, port)
    try:
        W, H, N = 24, 16, 13
        means, quats, scales, opacities, _ = random_gaussians(N, seed=3, spread=0.8, scale=0.3,
                                                              dtype=torch.float64)
        viewmats, Ks = cameras(3, W, H, dtype=torch.float64)
        g = torch.Generator().manual_seed(5)
        sh = torch.randn((N, 4, 3), generator=g, dtype=torch.float64) * 0.5
        bgs = torch.rand((3, 3), generator=g, dtype=torch.float64)
        weights = torch.randn((3, H, W, 3), generator=g, dtype=torch.float64)
        gauss = slice(0, 6) if rank == 0 else slice(6, 13)
        cams = slice(0, 1) if rank == 0 else slice(1, 3)
        for packed in (False, True):
            lists = []  # the isect_ids of each render below

            def render(params, vm, K, bg, distributed, packed=packed, lists=lists):
                colors, alphas, meta = tilesplat.rasterization(
                    *params, vm, K, W, H, sh_degree=1, packed=packed, backgrounds=bg,
                    distributed=distributed, tile_size=4, backend="torch")
                lists.append(meta["isect_ids"])
                return colors, alphas

            full = [t.clone().requires_grad_(True) for t in (means, quats, scales, opacities,
                                                             sh)]
            ref_c, ref_a = render(full, viewmats, Ks, bgs, False)
            assert float((ref_a > 0.1).double().mean()) > 0.2, "the scene should cover pixels"
            ((ref_c * weights).sum() + ref_a.sum()).backward()

            mine = [t[gauss].detach().clone().requires_grad_(True)
                    for t in (means, quats, scales, opacities, sh)]
            out_c, out_a = render(mine, viewmats[cams], Ks[cams], bgs[cams], True)
            with torch.no_grad(), box_tile_lists():
                render(mine, viewmats[cams], Ks[cams], bgs[cams], True)
            tight, dist_tight, dist_box = lists
            bits = ((W // 4) * (H // 4)).bit_length()  # the key bits of the 6 x 4 tiles
            image = tight >> (32 + bits)
            mine_in_full = (image >= cams.start) & (image < cams.stop)
            assert dist_tight.numel() == int(mine_in_full.sum()) < dist_box.numel()
            torch.testing.assert_close(out_c, ref_c[cams].detach(), atol=1e-6, rtol=0)
            torch.testing.assert_close(out_a, ref_a[cams].detach(), atol=1e-6, rtol=0)
            ((out_c * weights[cams]).sum() + out_a.sum()).backward()
            for name, a, e in zip(("means", "quats", "scales", "opacities", "sh"), mine, full,
                                  strict=True):
                torch.testing.assert_close(a.grad, e.grad[gauss], atol=1e-9, rtol=1e-5,
                                           msg=f"v_{name} (packed={packed})")
    finally:
        dist.destroy_process_group()


def test_sharded_rendering_matches_one_process():
    _spawn(_sharded_rendering)


def _data_parallel(rank: int, port: int, folder: str) -> None:
    """parallel = "data": 2 ranks x 2 cameras per step train as 1 process x 4 cameras does,
    through densification: same Gaussians, parameters within 1e-4, ranks identical."""
    from tilesplat.data.dataset import load_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.trainer import Trainer

    _init(rank, port)
    try:
        dataset = load_dataset(folder)
        common = dict(steps=12, batch_size=4, init_points=100, sh_degree=1,
                      sh_degree_interval=5, refine_start=2, refine_every=3, refine_stop=11,
                      reset_every=100, grow_grad2d=1e-5, random_background=False,
                      checkpoint_every=0, progress=False, lpips=False, backend="torch")
        # anisotropic scales: an isotropic Gaussian's rotation has a zero gradient, whose
        # rounding noise Adam (eps 1e-15) would turn into full-size steps of either sign
        aniso = torch.randn((100, 3), generator=torch.Generator().manual_seed(1)) * 0.5
        single = Trainer(TrainConfig(**common).validate(), dataset, f"{folder}/single{rank}",
                         log=lambda m: None)
        assert single.parallel.world_size == 1  # parallel = 'none': one process
        with torch.no_grad():
            single.params["scales"].add_(aniso)
        for step in range(12):
            single.train_step(step)
        ranks = Trainer(TrainConfig(parallel="data", **common).validate(), dataset,
                        f"{folder}/ranks", log=lambda m: None)
        assert ranks.parallel.world_size == WORLD
        with torch.no_grad():
            ranks.params["scales"].add_(aniso)
        for step in range(12):
            ranks.train_step(step)  # checks after every step that the ranks agree
        assert len(single.params["means"]) != 100, "the run should densify"
        assert len(ranks.params["means"]) == len(single.params["means"])
        for k in single.params:
            torch.testing.assert_close(ranks.params[k], single.params[k], atol=1e-4,
                                       rtol=1e-4, msg=f"parameter {k}")
    finally:
        dist.destroy_process_group()


def test_data_parallel_training_matches_one_process(tmp_path):
    from tilesplat.data.synthetic import write_synthetic_dataset

    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=16)
    _spawn(_data_parallel, str(folder))


def _run_cli(cmd: list[str], cwd, timeout: float = 240) -> tuple[int, str]:
    """Runs a command in its own session; on timeout the whole group is killed by PID."""
    import signal
    import subprocess

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{cmd} ran past {timeout} s:\n{out[-3000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out


TRAIN_SETS = ["--set", "steps=6", "--set", "batch_size=2", "--set", "init_points=100",
              "--set", "backend=torch", "--set", "lpips=false", "--set", "checkpoint_every=3",
              "--set", "progress=false"]


@pytest.mark.parametrize("launcher", ["nproc", "torchrun"])
def test_cli_trains_on_two_ranks(tmp_path, launcher):
    import sys

    from tilesplat.data.synthetic import write_synthetic_dataset

    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=16)
    run_dir = tmp_path / "run"
    args = ["train", "--data", str(folder), *TRAIN_SETS, "--set", f"run_dir={run_dir}"]
    if launcher == "nproc":
        cmd = [sys.executable, "-m", "tilesplat.cli", *args, "--nproc", "2"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               "--nproc-per-node=2", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "-m", "tilesplat.cli", *args]
    code, out = _run_cli(cmd, tmp_path)
    assert code == 0, out[-3000:]
    assert out.count("PSNR") == 1, out[-3000:]  # rank 0 alone reports
    assert (run_dir / "point_cloud.ply").is_file()
    assert "parallel = \"data\"" in (run_dir / "config.toml").read_text()
    # a resume on one process continues the 2-rank run's checkpoint
    code, out = _run_cli([sys.executable, "-m", "tilesplat.cli", "train", "--resume",
                          str(run_dir), "--set", "steps=8"], tmp_path)
    assert code == 0 and "resuming" in out, out[-3000:]
