"""The training device: the ``device`` key resolved and refused, the images kept on a GPU
when they fit, the logged numbers read back at log steps only, and checkpoints that stay on
the CPU. Without a GPU: ``torch.cuda.is_available`` is patched where only the resolution
logic is under test (nothing here touches CUDA)."""

from types import SimpleNamespace

import pytest
import torch

from tilesplat.cli import main
from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.devices import to_device
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop.progress import Progress
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.checkpoint import list_checkpoints, load_checkpoint
from tilesplat.train.step.device import device_frames, training_device
from tilesplat.train.step.metrics import psnr_of_mse


@pytest.fixture
def gpu(monkeypatch):
    """torch claims 2 GPUs (resolution logic only) and numba's simulator is off."""
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _resolve(**keys) -> str:
    return str(training_device(TrainConfig(**keys).validate()))


def test_auto_follows_the_backend_and_the_gpu(gpu):
    assert _resolve() == "cuda"  # backend auto then runs the cuda kernels on CUDA tensors
    assert _resolve(backend="cuda") == "cuda"
    assert _resolve(backend="torch") == "cpu"
    assert _resolve(backend="cpu") == "cpu"
    assert _resolve(backend="torch", device="cuda") == "cuda"
    assert _resolve(device="cuda:1") == "cuda:1"
    assert _resolve(device="cpu") == "cpu"
    # a distributed run too (outside its process group: the launcher's question)
    assert _resolve(parallel="data") == "cuda"


def test_auto_without_a_gpu_is_the_cpu(no_gpu):
    assert _resolve() == "cpu"
    assert _resolve(backend="torch") == "cpu"


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"device": "gpu"}, ["device must be one of", "'cuda:N'", "'gpu'"]),
        ({"device": "cuda:x"}, ["device must be one of", "'cuda:x'"]),
        ({"device": "cuda", "backend": "cpu"}, ["backend = 'cpu'", "device = 'cuda'"]),
        ({"device": "cpu", "dist_backend": "nccl"}, ["dist_backend = 'nccl'", "device = 'cpu'"]),
        ({"backend": "cpu", "dist_backend": "nccl"}, ["dist_backend = 'nccl'", "backend = 'cpu'"]),
        ({"dist_backend": "mpi"}, ["dist_backend must be one of", "'mpi'"]),
    ],
)
def test_config_errors_name_the_keys(keys, words):
    with pytest.raises(ValueError) as err:
        TrainConfig(**keys).validate()
    assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"device": "cuda"}, ["device 'cuda' needs a GPU", "torch sees none"]),
        ({"backend": "cuda"}, ["device = 'auto' with backend = 'cuda'", "torch sees none"]),
        ({"backend": "cuda", "device": "cpu"}, ["backend = 'cuda' needs device = 'cuda'"]),
    ],
)
def test_a_gpu_this_machine_lacks_is_a_clear_error(no_gpu, keys, words):
    with pytest.raises(ValueError) as err:
        training_device(TrainConfig(**keys).validate())
    assert all(w in str(err.value) for w in words), str(err.value)


def test_gpu_index_is_checked(gpu):
    with pytest.raises(ValueError, match=r"device = 'cuda:2': torch sees 2 GPU\(s\)"):
        _resolve(device="cuda:2")
    # a rank's GPU (cuda:LOCAL_RANK) is tests/test_multi_gpu.py's


def test_under_the_simulator_the_cuda_backend_trains_on_the_cpu(gpu, monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert _resolve(backend="cuda") == "cpu"
    assert _resolve(backend="cuda", device="cpu") == "cpu"
    assert _resolve() == "cpu"
    with pytest.raises(ValueError, match="simulator runs backend 'cuda' on CPU tensors"):
        _resolve(backend="cuda", device="cuda")


def test_check_reports_the_device(tmp_path, capsys, no_gpu):
    path = tmp_path / "c.toml"
    path.write_text("steps = 10\n")
    assert main(["check", str(path)]) == 0
    assert "device: cpu;" in capsys.readouterr().out
    # valid, meant for another machine: said, not refused
    assert main(["check", str(path), "--set", "device=cuda"]) == 0
    assert "device: none on this machine (device 'cuda' needs a GPU" in capsys.readouterr().out
    assert main(["check", str(path), "--set", "device=cuda", "--set", "backend=cpu"]) == 2
    assert "backend = 'cpu'" in capsys.readouterr().err


def test_train_refuses_a_missing_gpu_before_any_work(tmp_path, capsys, no_gpu):
    assert main(["train", "--set", "backend=cuda", "--set", f"cache_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "torch sees none" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # the built-in scene was not written


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory):
    folder = write_synthetic_dataset(tmp_path_factory.mktemp("scene"), n_train=4, n_test=1, size=16)
    return load_dataset(folder)


def test_images_stay_on_a_gpu_when_they_fit(tiny_scene, monkeypatch):
    frames = tiny_scene.train
    nbytes = sum(f.image.nbytes + (0 if f.alpha is None else f.alpha.nbytes) for f in frames)
    meta = torch.device("meta")  # stands for a GPU: tensors move there without CUDA
    for memory, cached in ((8 * nbytes, True), (8 * nbytes - 8, False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda d, m=memory: SimpleNamespace(total_memory=m))
        moved = device_frames(frames, meta)
        assert all(f.viewmat.device == meta and f.K.device == meta for f in moved)
        assert all((f.image.device == meta) == cached for f in moved), memory
        assert all(f.alpha is None or (f.alpha.device == meta) == cached for f in moved)
    assert device_frames(frames, torch.device("cpu")) == list(frames)


def test_to_device_keeps_the_structure():
    t = torch.ones(2)
    state = {"a": [t, (t, 3)], "b": "x", "c": None}
    out = to_device(state, "cpu")
    assert out == {"a": [t, (t, 3)], "b": "x", "c": None} and out["a"][0] is t
    assert out is not state and isinstance(out["a"][1], tuple)
    assert to_device(state, "meta")["a"][1][0].device.type == "meta"


def _cfg(**keys) -> TrainConfig:
    base = dict(steps=11, init_points=60, sh_degree=1, refine_start=2, refine_every=3,
                refine_stop=9, log_every=4, checkpoint_every=5, keep_checkpoints=5,
                progress=False, lpips=False, backend="torch")
    return TrainConfig(**{**base, **keys}).validate()


def test_logged_numbers_are_the_steps_numbers(tiny_scene, tmp_path, one_torch_thread):
    """The loss and PSNR read back at log steps average every step of the window, also
    across a checkpoint in mid-window (5 is not a multiple of 4), which resumes bit for bit."""
    cfg = _cfg()
    trainer = Trainer(cfg, tiny_scene, tmp_path / "run", log=lambda s: None)
    seen = []
    step_fn = trainer.train_step

    def recording(step):
        loss, mse = step_fn(step)
        seen.append((float(loss), psnr_of_mse(float(mse))))
        return loss, mse

    trainer.train_step = recording
    trainer.train()
    assert trainer.history["step"] == [4, 8, 11]
    for i, (lo, hi) in enumerate(((0, 4), (4, 8), (8, 11))):
        window = seen[lo:hi]
        assert trainer.history["loss"][i] == sum(x[0] for x in window) / len(window)
        assert trainer.history["psnr"][i] == sum(x[1] for x in window) / len(window)
    first = load_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert first["step"] == 5 and first["window"][2] == 1  # step 5 is in it
    assert "cuda_rng" not in first
    tensors = list(_tensors(first))
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    resumed = Trainer(cfg, tiny_scene, tmp_path / "again", checkpoint=first)
    resumed.train()
    for key in ("loss", "psnr", "gaussians"):
        assert resumed.history[key] == trainer.history[key], key
    for k in trainer.params:
        assert torch.equal(resumed.params[k], trainer.params[k]), k


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def test_progress_reads_lazy_numbers_only_when_it_draws():
    class Stream:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return False

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    stream = Stream()
    progress = Progress(100, stream=stream)
    calls = []

    def psnr():
        calls.append(1)
        return 21.5

    progress.update(3, loss=torch.tensor(0.25), psnr=psnr)  # not a tenth: not drawn
    assert calls == [] and stream.text == ""
    progress.update(10, loss=torch.tensor(0.25), psnr=psnr, gaussians=7)
    assert calls == [1]
    assert "loss 0.25  psnr 21.5  gaussians 7" in stream.text


def test_the_deterministic_key_sets_the_cuda_option_and_refuses_torch_on_a_gpu():
    """deterministic = true: the cuda backend's option for a run that renders with it
    (docs/gpu.md, reproducible gradients); nothing for the cpu backend, which is bit-exact;
    refused for the torch reference on a GPU (PyTorch's atomic index ops)."""
    pytest.importorskip("numba_cuda")
    from tilesplat.backends.cuda import get_options, reset_options
    from tilesplat.train.step.determinism import apply_determinism

    try:
        apply_determinism(TrainConfig(backend="cpu", deterministic=True), torch.device("cpu"))
        assert get_options()["deterministic"] is False
        apply_determinism(TrainConfig(backend="cuda", deterministic=True), torch.device("cpu"))
        assert get_options()["deterministic"] is True
        apply_determinism(TrainConfig(backend="cuda"), torch.device("cpu"))
        assert get_options()["deterministic"] is False
        apply_determinism(TrainConfig(backend="auto", deterministic=True),
                          torch.device("cuda"))
        assert get_options()["deterministic"] is True
    finally:
        reset_options()
    with pytest.raises(ValueError, match="deterministic = true with backend = 'torch'"):
        TrainConfig(backend="torch", device="cuda", deterministic=True).validate()
