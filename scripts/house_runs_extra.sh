#!/usr/bin/env bash
# Behaviour unchanged, more runs: data-parallel with pose_opt and affine (also hashes poses.json
# and appearance.json), the budget strategy, mcmc with a key given after its preset.
# Usage: scripts/house_runs_extra.sh OUTDIR   (as scripts/house_runs.sh)
set -u
OUT=${1:?}
TS=${TILESPLAT:-.venv/bin/tilesplat}
mkdir -p "$OUT"
COMMON="--set steps=200 --set synthetic_size=48 --set synthetic_train=10 --set synthetic_test=2 \
 --set cache_dir=${CACHE:-/tmp/tilesplat-house-cache} --set checkpoint_every=0 --set lpips=false --set save_renders=false \
 --set progress=false --set refine_start=60 --set refine_stop=160 --set refine_every=40 \
 --set reset_every=150 --set sh_degree_interval=80 --set init_points=2000"
run() { name=$1; shift
  rm -rf "$OUT/$name"
  $TS train $COMMON --set run_dir=$OUT/$name "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(sha256sum $OUT/$name/point_cloud.ply 2>/dev/null | cut -c1-16) $(sha256sum $OUT/$name/poses.json 2>/dev/null | cut -c1-16) $(sha256sum $OUT/$name/appearance.json 2>/dev/null | cut -c1-16)"
}
run data2_feat --nproc 2 --set parallel=data --set batch_size=2 --set pose_opt=true --set post_processing=affine --set synthetic_scene=exposure
run budget --set strategy=budget --set cap_max=2500
run mcmc_file_auto --set strategy=mcmc --set cap_max=3000 --set init_scale=0.2
