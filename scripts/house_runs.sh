#!/usr/bin/env bash
# Behaviour unchanged (issue 39): twelve fixed-seed CPU runs (default, mcmc, 2dgs, the fast
# recipe, bilateral grid, affine, pose_opt, depth prior, the average with the resolution schedule
# and early stop, --nproc 2 data and model modes) print the sha256 of each point_cloud.ply.
# Run it on two trees (PYTHONPATH=OTHER/src picks the other one) and compare the lines.
# Usage: scripts/house_runs.sh OUTDIR   (TILESPLAT: the command, CACHE: the scenes' cache)
set -u
OUT=${1:?}
TS=${TILESPLAT:-.venv/bin/tilesplat}
mkdir -p "$OUT"
COMMON="--set steps=300 --set synthetic_size=48 --set synthetic_train=10 --set synthetic_test=2 \
 --set cache_dir=${CACHE:-/tmp/tilesplat-house-cache} --set checkpoint_every=0 --set lpips=false --set save_renders=false \
 --set progress=false --set refine_start=60 --set refine_stop=240 --set refine_every=40 \
 --set reset_every=150 --set sh_degree_interval=80 --set init_points=2000"
run() { name=$1; shift
  rm -rf "$OUT/$name"
  $TS train $COMMON --set run_dir=$OUT/$name "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(sha256sum $OUT/$name/point_cloud.ply 2>/dev/null | cut -c1-16)"
}
run default
run mcmc --set strategy=mcmc --set cap_max=3000
run 2dgs --set model=2dgs --set normal_start=100 --set dist_start=50
run fast --set recipe=fast
run bilateral --set post_processing=bilateral_grid --set synthetic_scene=exposure
run affine --set post_processing=affine --set synthetic_scene=exposure
run pose --set pose_opt=true
run depth --set depth_loss=true --set synthetic_scene=garden --set synthetic_train=8
run ema_res --set ema_decay=0.9 --set resolution_start=2 --set eval_every=100 --set early_stop_patience=2 --set batch_size=2
run data2 --nproc 2 --set parallel=data --set batch_size=2
run model2 --nproc 2 --set parallel=model --set batch_size=2
run mcmc_model2 --nproc 2 --set parallel=model --set strategy=mcmc --set cap_max=3000 --set batch_size=2
