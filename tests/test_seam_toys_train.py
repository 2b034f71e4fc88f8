"""The trainer's seams take a new variant with no edit elsewhere (docs/README.md, "Where
things go"): a toy strategy, model kind, training feature, parallel mode and recipe, each a
class in a package written into a temporary folder, register themselves and train.

The toys run in a child process, so that their registrations (global tables) do not reach
the other tests of this worker. Each toy declares a config key of its own; the child checks
that the key reaches --list-keys, the TOML reader, the saved config.toml and validation, and
that the trainer calls the toy at its seam in a short run."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

TOYS = '''
"""Toy variants of the trainer's seams: nothing of tilesplat is edited to add them."""

from typing import ClassVar

import torch

from tilesplat.keys import Key
from tilesplat.strategy import DefaultStrategy
from tilesplat.train import seams
from tilesplat.train.features.base import Feature, register_feature
from tilesplat.train.models.gaussians import Gaussians
from tilesplat.train.parallel.base import Parallel

CALLS = {"strategy": 0, "model": 0, "feature": 0, "parallel": 0}


@seams.register("strategy", "toy")
class ToyStrategy(DefaultStrategy):
    """The default strategy that also counts its post-backward calls."""

    KEYS: ClassVar = (*DefaultStrategy.KEYS, Key("toy_strategy_every", 2, "toy: count every n "
                      "steps", ge=1))
    PRESET: ClassVar = {"init_opacity": 0.3}
    every: int = 2

    @classmethod
    def from_config(cls, cfg, key_for_gradient="means2d"):
        made = super().from_config(cfg, key_for_gradient)
        made.every = cfg.toy_strategy_every
        return made

    def step_post_backward(self, params, optimizers, state, step, info, packed=False):
        if step % self.every == 0:
            CALLS["strategy"] += 1
        super().step_post_backward(params, optimizers, state, step, info, packed=packed)


@seams.register("model", "toy")
class ToyModel(Gaussians):
    """3D Gaussians with a penalty on their mean opacity."""

    KEYS: ClassVar = (Key("toy_model_weight", 0.5, "toy: weight of the opacity penalty",
                          ge=0.0),)

    def regularisation(self, out, cfg, step):
        CALLS["model"] += 1
        return cfg.toy_model_weight * out.alphas.mean()


@register_feature
class ToyGain(Feature):
    """A learned gain on every render (one number), switched on by its key."""

    name = "toy_gain"
    KEYS: ClassVar = (Key("toy_gain", False, "toy: learn a gain of the renders"),)

    @classmethod
    def from_config(cls, cfg, dataset, device):
        return cls(device) if cfg.toy_gain else None

    def __init__(self, device):
        self.gain = torch.ones((), device=device, requires_grad=True)
        self.opt = torch.optim.Adam([self.gain], lr=0.01)

    def colors(self, colors, batch, step):
        return colors * self.gain

    def parameters(self):
        return [self.gain]

    def optimizer_step(self, step):
        CALLS["feature"] += 1
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def state_dict(self):
        return {"gain": self.gain.detach().cpu().clone()}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.gain.copy_(state["gain"])


@seams.register("parallel", "toy")
class ToyParallel(Parallel):
    """One process that halves the batch: it renders the first half of each step's cameras."""

    SEVERAL_RANKS = False
    KEYS: ClassVar = (Key("toy_share", 2, "toy: render 1 / n of each batch", ge=1),)

    @classmethod
    def config_errors(cls, cfg):
        return [] if cfg.batch_size % cfg.toy_share == 0 else ["toy_share must divide batch_size"]

    def my_cameras(self, indices):
        CALLS["parallel"] += 1
        return indices[: max(1, len(indices) // 2)]

    def reduce_gradients(self, tensors):
        self.reduced = len(tensors)


@seams.register("recipe", "toy")
class ToyRecipe:
    """A recipe: fewer random points and a later start of the densification."""

    PRESET: ClassVar = {"init_points": 300, "refine_start": 4}
'''

CHILD = '''
import json, sys, tempfile
from pathlib import Path

import toyseams
from tilesplat.cli import main
from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig, apply_overrides, config_to_toml, describe_keys
from tilesplat.train.config import load_config
from tilesplat.train.loop.trainer import Trainer

out = {}
tmp = Path(sys.argv[1])
data = load_dataset(write_synthetic_dataset(tmp / "scene", n_train=4, n_test=1, size=24))
keys = ("toy_strategy_every", "toy_model_weight", "toy_gain", "toy_share")
listed = describe_keys()
out["listed"] = all(f"  {k} (" in listed for k in keys)
cfg = apply_overrides(TrainConfig(), ["recipe=toy", "strategy=toy", "model=toy", "toy_gain=true",
                                      "parallel=toy", "batch_size=2", "steps=6", "lpips=false",
                                      "toy_strategy_every=3", "progress=false"])
out["preset"] = [cfg.init_opacity, cfg.init_points, cfg.refine_start]
(tmp / "c.toml").write_text(config_to_toml(cfg))
out["round_trip"] = load_config(tmp / "c.toml") == cfg
for bad in ("toy_share=0", "toy_model_weight=-1"):
    try:
        apply_overrides(cfg, [bad])
        out[bad] = "accepted"
    except ValueError as exc:
        out[bad] = str(exc)
try:
    apply_overrides(cfg, ["batch_size=3"])
except ValueError as exc:
    out["variant_check"] = str(exc)
trainer = Trainer(cfg, data, tmp / "run", log=lambda s: None)
trainer.train()
out["calls"] = dict(toyseams.CALLS)
out["reduced"] = trainer.parallel.reduced
out["gain_moved"] = float(trainer.features[0].gain) != 1.0
out["checkpoint_feature"] = sorted(trainer.state_dict()["features"])
out["n_gaussians"] = trainer.n_gaussians
out["train_cli"] = main(["train", "--data", str(tmp / "scene"), "--set", "model=toy",
                         "--set", "strategy=toy", "--set", "steps=3", "--set", "lpips=false",
                         "--set", "progress=false", "--set", f"run_dir={tmp / 'cli'}"])
out["saved"] = "toy_model_weight = 0.5" in (tmp / "cli" / "config.toml").read_text()
print("RESULT " + json.dumps(out))
'''


def test_toy_variants_of_every_trainer_seam_train_with_no_edit_elsewhere(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "toyseams").mkdir(parents=True)
    (pkg / "toyseams" / "__init__.py").write_text(textwrap.dedent(TOYS))
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(pkg), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the toy seams' child ran past 240 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, text[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["listed"] and got["round_trip"] and got["saved"]
    # the recipe's and the strategy's presets, the key given with them after them
    assert got["preset"] == [0.3, 300, 4]
    assert got["toy_share=0"].endswith("toy_share must be >= 1, got 0")
    assert "toy_model_weight must be >= 0, got -1.0" in got["toy_model_weight=-1"]
    assert "toy_share must divide batch_size" in got["variant_check"]
    calls = got["calls"]
    assert calls["parallel"] == 6 and calls["feature"] == 6 and calls["model"] >= 6
    assert calls["strategy"] == 2  # steps 0 and 3 of 6, every toy_strategy_every = 3
    assert got["reduced"] == 7  # the six parameters and the feature's gain
    assert got["gain_moved"] and got["checkpoint_feature"] == ["toy_gain"]
    assert got["n_gaussians"] > 0 and got["train_cli"] == 0
