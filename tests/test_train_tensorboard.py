"""TensorBoard events (``tensorboard = true``), read back with tensorboard's own reader.

A tiny run writes the training log's scalars (checked step by step and value by value against
history.json), the test PSNR and renders at its evaluations; a resume from an earlier
checkpoint shows no step twice; the key is listed and checked; the writer is closed when the
training raises.
"""

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tilesplat.cli import main
from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig, config_to_toml, describe_keys
from tilesplat.train.loop import tensorboard as board_module
from tilesplat.train.loop import trainer as trainer_module
from tilesplat.train.loop.run import resume_run, train_run
from tilesplat.train.loop.tensorboard import NO_BOARD, TEST_VIEWS, open_board
from tilesplat.train.loop.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 24


def tiny_config(tmp_path, run, **keys) -> TrainConfig:
    data = write_synthetic_dataset(tmp_path / "scene", n_train=6, n_test=TEST_VIEWS + 1,
                                   size=SIZE)
    values = dict(
        data=str(data), run_dir=str(run), steps=30, log_every=5, eval_every=10,
        checkpoint_every=10, init_points=200, sh_degree=1, refine_start=10, refine_stop=25,
        refine_every=5, backend="torch", progress=False, lpips=False, save_renders=False,
        save_ply=False, tensorboard=True,
    )
    values.update(keys)
    return TrainConfig(**values).validate()


def events(run) -> EventAccumulator:
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def scalar(acc: EventAccumulator, tag: str) -> tuple[list[int], list[float]]:
    found = acc.Scalars(tag)
    return [e.step for e in found], [e.value for e in found]


def check_against_history(acc: EventAccumulator, history: dict) -> None:
    for tag, key in (("train/loss", "loss"), ("train/psnr", "psnr"),
                     ("train/gaussians", "gaussians")):
        steps, values = scalar(acc, tag)
        assert steps == history["step"], tag  # every logged step once, in order
        assert values == pytest.approx(history[key], rel=1e-6), tag  # stored as float32
    steps, rates = scalar(acc, "train/steps_per_second")
    assert steps == history["step"]
    s, t = history["step"], history["time"]
    want = [(s[i] - (s[i - 1] if i else 0)) / (t[i] - (t[i - 1] if i else 0.0))
            for i in range(len(s))]
    assert rates == pytest.approx(want, rel=1e-5)
    steps, values = scalar(acc, "test/psnr")
    assert steps == history["test_step"]
    assert values == pytest.approx(history["test_psnr"], rel=1e-6)


def test_events_hold_the_training_log_and_a_resume_adds_no_step_twice(tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, run)
    train_run(cfg, log=lambda _: None)
    history = json.loads((run / "history.json").read_text())
    assert history["step"] == list(range(5, 31, 5)) and history["test_step"] == [10, 20, 30]
    acc = events(run)
    check_against_history(acc, history)
    # learning rates at every logged step: the means' decays, the others stay
    steps, means_lr = scalar(acc, "lr/means")
    assert steps == history["step"] and means_lr[-1] < means_lr[0]
    assert scalar(acc, "lr/opacities")[1] == pytest.approx([cfg.opacities_lr] * 6)
    # the first TEST_VIEWS test views as images at every evaluation, at the render's size
    dataset = load_dataset(cfg.data)
    tags = sorted(acc.Tags()["images"])
    assert tags == sorted(f"test/{f.name}" for f in dataset.test[:TEST_VIEWS])
    for tag in tags:
        images = acc.Images(tag)
        assert [im.step for im in images] == [10, 20, 30]
        assert (images[0].width, images[0].height) == (SIZE, SIZE)
        assert images[-1].encoded_image_string[:4] == b"\x89PNG"

    # an interruption after step 20's checkpoint: the resume redoes steps 21-30
    (run / "checkpoints" / "step_0000030.pt").unlink()
    resume_run(run, log=lambda _: None)
    history = json.loads((run / "history.json").read_text())
    assert history["step"] == list(range(5, 31, 5))
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    acc = events(run)
    check_against_history(acc, history)  # without the purge step, 25 and 30 came twice
    assert [im.step for im in acc.Images(tags[0])] == [10, 20, 30]


def test_a_resume_that_turns_the_board_on_writes_the_earlier_history(tmp_path):
    run = tmp_path / "run"
    train_run(tiny_config(tmp_path, run, steps=10, eval_every=5, tensorboard=False),
              log=lambda _: None)
    assert not (run / "tensorboard").exists()
    resume_run(run, ["steps=20", "tensorboard=true"], log=lambda _: None)
    history = json.loads((run / "history.json").read_text())
    assert history["step"] == [5, 10, 15, 20] and history["test_step"] == [5, 10, 15, 20]
    check_against_history(events(run), history)


def test_the_writer_is_closed_when_training_raises(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path, tmp_path / "run", steps=20, eval_every=0)
    opened = []

    def spy(*args):
        opened.append(open_board(*args))
        return opened[-1]

    monkeypatch.setattr(trainer_module, "open_board", spy)
    trainer = Trainer(cfg, load_dataset(cfg.data), tmp_path / "run")
    step = trainer.train_step

    def failing(i):
        if i == 12:
            raise RuntimeError("boom")
        return step(i)

    monkeypatch.setattr(trainer, "train_step", failing)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert opened[0].writer.file_writer is None  # closed (torch's writer drops it on close)
    assert trainer.board is NO_BOARD
    steps, _ = scalar(events(tmp_path / "run"), "train/loss")
    assert steps == [5, 10]  # what was logged before the failure is on disk


def test_only_the_writing_rank_opens_a_board(tmp_path):
    cfg = TrainConfig(tensorboard=True)
    history = {"step": [], "test_step": []}
    assert open_board(cfg, tmp_path, 0, history, writes=False) is NO_BOARD
    assert open_board(TrainConfig(), tmp_path, 0, history, writes=True) is NO_BOARD
    assert not (tmp_path / "tensorboard").exists()


def test_the_key_is_listed_and_checked(tmp_path, capsys, monkeypatch):
    assert main(["train", "--list-keys"]) == 0
    listed = capsys.readouterr().out
    assert "  tensorboard (bool; default false): write TensorBoard events" in listed
    assert "tensorboard (bool; default false)" in describe_keys()
    path = tmp_path / "c.toml"
    path.write_text(config_to_toml(TrainConfig()))
    assert main(["check", str(path), "--set", "tensorboard=true"]) == 0
    assert "differs from the defaults in: tensorboard" in capsys.readouterr().out
    assert main(["check", str(path), "--set", "tensorboard=maybe"]) == 2
    assert "--set tensorboard: expected true or false" in capsys.readouterr().err
    monkeypatch.setattr(board_module, "tensorboard_installed", lambda: False)
    assert main(["check", str(path), "--set", "tensorboard=true"]) == 2
    err = capsys.readouterr().err
    assert "tensorboard = true needs the tensorboard package" in err
    assert 'pip install "tilesplat[tensorboard]"' in err
    with pytest.raises(ValueError, match="tilesplat\\[tensorboard\\]"):
        TrainConfig(tensorboard=True).validate()
    TrainConfig(tensorboard=False).validate()  # off: nothing to install


def test_values_are_the_float_history_not_tensors():
    # the board reads only the history's Python numbers: no tensor reaches the writer
    class Writer:
        def __init__(self):
            self.seen = []

        def add_scalar(self, tag, value, step):
            self.seen.append((tag, value, step))

    board = board_module.TensorBoard.__new__(board_module.TensorBoard)
    board.writer, board.written, board.tested = Writer(), 0, 0
    history = {"step": [5], "time": [0.5], "loss": [0.25], "psnr": [20.0], "gaussians": [7],
               "test_step": [], "test_psnr": []}
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.125)
    board.record(history, {"x": opt})
    assert board.writer.seen == [
        ("train/loss", 0.25, 5), ("train/psnr", 20.0, 5), ("train/gaussians", 7, 5),
        ("train/steps_per_second", 10.0, 5), ("lr/x", 0.125, 5),
    ]
    board.record(history, {"x": opt})  # nothing new: nothing written
    assert len(board.writer.seen) == 5
