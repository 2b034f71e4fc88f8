"""The training config: defaults, TOML round trip, --set flags, unknown keys, check command."""

import sys

import pytest
import torch

from tilesplat.cli import main
from tilesplat.train import seams
from tilesplat.train.config import (
    TrainConfig,
    apply_overrides,
    config_from_dict,
    config_to_toml,
    load_config,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def test_every_key_has_a_default_a_doc_and_its_default_is_valid():
    for key in seams.key_table().values():
        assert len(key.doc) > 10, key.name
        assert key.problem(key.default) is None, key.name
    TrainConfig().validate()
    with pytest.raises(AttributeError, match="not changed in place"):
        TrainConfig().steps = 3
    with pytest.raises(ValueError, match="unknown config key 'stepz'; did you mean 'steps'"):
        TrainConfig(stepz=3)


def test_gsplat_recipe_defaults():
    cfg = TrainConfig()
    assert (cfg.means_lr, cfg.scales_lr, cfg.quats_lr) == (1.6e-4, 5e-3, 1e-3)
    assert (cfg.opacities_lr, cfg.sh0_lr, cfg.shN_lr) == (5e-2, 2.5e-3, 2.5e-3 / 20)
    assert (cfg.means_lr_final, cfg.ssim_lambda, cfg.sh_degree_interval) == (0.01, 0.2, 1000)


def test_toml_round_trip(tmp_path):
    cfg = apply_overrides(
        TrainConfig(),
        [
            'data=some "quoted" path\\x',
            "steps=123",
            "means_lr=2e-05",
            "absgrad=true",
            "strategy=mcmc",
            "far_plane=1e12",
        ],
    )
    text = config_to_toml(cfg)
    assert tomllib.loads(text)["steps"] == 123
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert load_config(path) == cfg
    # every key is preceded by its doc line
    lines = text.splitlines()
    for key in seams.key_table().values():
        i = next(k for k, line in enumerate(lines) if line.startswith(f"{key.name} = "))
        assert lines[i - 1] == f"# {key.doc}"


def test_unknown_key_suggests_closest(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("step = 10\n")
    with pytest.raises(ValueError, match=r"unknown config key 'step'; did you mean 'steps'\?"):
        load_config(path)
    with pytest.raises(ValueError, match="did you mean 'grow_grad2d'"):
        apply_overrides(TrainConfig(), ["grow_grad2=1e-4"])
    with pytest.raises(ValueError, match="unknown config key 'zzzz'$"):
        config_from_dict({"zzzz": 1})


def test_wrong_types_and_ranges(tmp_path):
    with pytest.raises(ValueError, match="steps must be int"):
        config_from_dict({"steps": "10"})
    with pytest.raises(ValueError, match="steps must be int"):
        config_from_dict({"steps": True})
    assert config_from_dict({"means_lr": 1}).means_lr == 1.0  # int accepted for float
    with pytest.raises(ValueError, match="strategy must be one of"):
        config_from_dict({"strategy": "adc"})
    with pytest.raises(ValueError, match="sh_degree must be in 0..4"):
        config_from_dict({"sh_degree": 5})
    with pytest.raises(ValueError, match="init_opacity must be in"):
        apply_overrides(TrainConfig(), ["init_opacity=1.5"])
    with pytest.raises(ValueError, match="expected true or false"):
        apply_overrides(TrainConfig(), ["absgrad=maybe"])
    with pytest.raises(ValueError, match="expected int"):
        apply_overrides(TrainConfig(), ["steps=ten"])
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides(TrainConfig(), ["steps"])
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3\n")
    with pytest.raises(ValueError, match="not a valid TOML"):
        load_config(bad)
    table = tmp_path / "table.toml"
    table.write_text("[optim]\nmeans_lr = 1.0\n")
    with pytest.raises(ValueError, match="tables are not used"):
        load_config(table)


def test_set_parses_by_field_type():
    cfg = apply_overrides(
        TrainConfig(), ["steps=1_000", "white_background=no", "means_lr=3e-4", "backend=torch"]
    )
    assert (cfg.steps, cfg.white_background, cfg.means_lr, cfg.backend) == (
        1000,
        False,
        3e-4,
        "torch",
    )


def test_check_command(tmp_path, capsys):
    good = tmp_path / "good.toml"
    good.write_text('steps = 77\nstrategy = "mcmc"\n')
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "strategy, steps, init_opacity, init_scale" in out
    bad = tmp_path / "bad.toml"
    bad.write_text("refine_evry = 10\n")
    assert main(["check", str(bad)]) == 2
    assert "did you mean 'refine_every'" in capsys.readouterr().err
    missing = tmp_path / "nodata.toml"
    missing.write_text(f'data = "{tmp_path / "nothing"}"\n')
    assert main(["check", str(missing)]) == 2
    assert "dataset folder not found" in capsys.readouterr().err


def test_a_strategy_sets_its_preset_and_the_saved_config_shows_it(tmp_path):
    from tilesplat.data.dataset import load_dataset
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.loop.trainer import Trainer

    keys = ("init_opacity", "init_scale", "opacity_reg", "scale_reg")
    assert [getattr(TrainConfig(), k) for k in keys] == [0.1, 1.0, 0.0, 0.0]  # 3DGS
    mcmc = apply_overrides(TrainConfig(), ["strategy=mcmc"])
    assert [getattr(mcmc, k) for k in keys] == [0.5, 0.1, 0.01, 0.01]  # 3DGS-MCMC
    assert "init_opacity = 0.5\n" in config_to_toml(mcmc)  # the effective value, saved
    # the keys given with the choice win over its preset, in any order
    mine = apply_overrides(TrainConfig(), ["opacity_reg=0", "strategy=mcmc", "init_scale=2"])
    assert (mine.opacity_reg, mine.init_scale, mine.init_opacity) == (0.0, 2.0, 0.5)
    # a later choice of another strategy sets the preset keys back; other keys stay
    back = apply_overrides(mine.replace(steps=7), ["strategy=default"])
    assert [getattr(back, k) for k in keys] == [0.1, 1.0, 0.0, 0.0] and back.steps == 7
    assert TrainConfig(strategy="mcmc") == mcmc
    # a config written before the presets held -1 ("the strategy's"): read as not given
    old = config_from_dict({"strategy": "mcmc", "init_opacity": -1.0, "scale_reg": -1})
    assert old == mcmc
    with pytest.raises(ValueError, match="opacity_reg must be >= 0, got -2.0"):
        apply_overrides(TrainConfig(), ["opacity_reg=-2"])
    with pytest.raises(ValueError, match=r"init_scale must be > 0, got 0"):
        apply_overrides(TrainConfig(), ["init_scale=0"])
    # the trainer runs the config's values and its checkpoints keep them
    data = load_dataset(write_synthetic_dataset(tmp_path / "d", n_train=2, n_test=1, size=16))
    cfg = TrainConfig(strategy="mcmc", init_points=20, steps=2, progress=False, lpips=False)
    trainer = Trainer(cfg, data, tmp_path / "run", log=lambda s: None)
    assert torch.allclose(torch.sigmoid(trainer.params["opacities"]), torch.tensor(0.5))
    assert trainer.state_dict()["config"]["opacity_reg"] == 0.01


def test_list_keys_and_docs_read_the_one_table(capsys):
    from pathlib import Path

    from tilesplat.train.config import describe_keys, keys_markdown

    assert main(["train", "--list-keys"]) == 0
    listed = capsys.readouterr().out
    assert listed.strip() == describe_keys().strip()
    page = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    assert keys_markdown() in page, "docs/config.md: regenerate its table (docs/config.md)"
    for key in seams.key_table().values():
        assert f"  {key.name} (" in listed and f"| `{key.name}` |" in page
