#!/usr/bin/env bash
# On the GPU machine, from the repository root: install the bundle, build the tiny model, run scenarios under
# `guardian run`, pack the evidence into $OUT/harness.tar.gz (the device tool brings back at most 8 files).
#   bash gpu/device.sh SCENARIOS [gpu.device_run options...]     e.g.  bash gpu/device.sh healthy,unguarded
set -u
scenarios=${1:?usage: gpu/device.sh SCENARIOS [options]}; shift
out=${OUT:-/tmp/harness-out}; result=$out/harness; mkdir -p "$result"
# NVLink multicast stays off (the machine's GPUs are shared); no network: everything offline
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
rm -rf /tmp/harness  # a warm machine keeps the last call's scratch folder
python3 -m gpu.bundle install --target /tmp/site > "$result/install.log" 2>&1 || { tail -20 "$result/install.log"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD VERL_USE_EXTERNAL_MODULES=gpu.verl_plugin
python3 -m gpu.tiny --out /tmp/tiny > "$result/tiny.log" 2>&1 || { tail -20 "$result/tiny.log"; exit 4; }
search=()
if [[ ,$scenarios, == *,search,* ]]; then
  # the recipe's scenario: the tiny search model taught the protocol's shape, a corpus from the HotpotQA sample's
  # own paragraphs, and the `guardian` and `ray` commands recipe/run.sh calls (the bundle installs no console scripts)
  fixture=tests/fixtures/recipe/hotpotqa_train_100.json
  { python3 -m gpu.tiny --task search --out /tmp/tiny-search --warm-start "$fixture" --warm-steps 600 &&
    python3 -m recipe.search.hotpot_corpus --hotpotqa "$fixture" --out /tmp/search-corpus.jsonl
  } > "$result/search-setup.log" 2>&1 || { tail -20 "$result/search-setup.log"; exit 4; }
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec python3 -m guardian "$@"\n' > /tmp/bin/guardian
  printf '#!/bin/sh\nexec python3 -c "import sys; from ray.scripts.scripts import main; sys.exit(main())" "$@"\n' > /tmp/bin/ray
  chmod +x /tmp/bin/guardian /tmp/bin/ray
  export PATH=/tmp/bin:$PATH
  # a head without the dashboard (the bundle's Ray has no dashboard build); run.sh finds it and reuses it
  ray start --head --include-dashboard=false > "$result/ray-start.log" 2>&1 || { tail -20 "$result/ray-start.log"; exit 4; }
  search=(--search-tiny /tmp/tiny-search --search-corpus /tmp/search-corpus.jsonl)
fi
{ nvidia-smi; python3 -c "import torch, transformers, ray, verl; print(torch.__version__, transformers.__version__, ray.__version__, verl.__version__)"; } > "$result/machine.txt" 2>&1
python3 -m gpu.device_run --trainer verl --tiny /tmp/tiny --scenarios "$scenarios" --work /tmp/harness --out "$result" \
  ${search[@]+"${search[@]}"} "$@"
rc=$?
((${#search[@]})) && ray stop > /dev/null 2>&1
nvidia-smi --query-gpu=memory.used --format=csv > "$result/gpu-after.txt" 2>&1
tar -C "$out" -czf "$out/harness.tar.gz" harness && rm -rf "$result"
exit $rc
