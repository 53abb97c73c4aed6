#!/usr/bin/env bash
# On the GPU machine, from the repository root: install the bundle, build the tiny model, run scenarios under
# `guardian run`, pack the evidence into $OUT/harness.tar.gz (the device tool brings back at most 8 files).
#   bash gpu/device.sh SCENARIOS [gpu.device_run options...]     e.g.  bash gpu/device.sh healthy,unguarded
#   bash gpu/device.sh collapse,healthy,unguarded --gpus 2        (FSDP over 2 ranks, 2 hf rollout replicas)
#   bash gpu/device.sh search-8gpu --shape-steps 12               (the recipe on 8 GPUs, Qwen2.5-7B-shaped model)
#   bash gpu/device.sh twins --settings sane,lr-high --both --steps 40   (twins: gpu.scenarios.SETTINGS, gpu/twins.py)
set -u
scenarios=${1:?usage: gpu/device.sh SCENARIOS [options]}; shift
out=${OUT:-/tmp/harness-out}; result=$out/harness; mkdir -p "$result"
# the GPU count the scenarios ask for (--gpus N; search-8gpu alone defaults to 8): fail in a second, not after setup
gpus=1; prev=""
for arg in "$@"; do [[ $prev == --gpus ]] && gpus=$arg; [[ $arg == --gpus=* ]] && gpus=${arg#--gpus=}; prev=$arg; done
[[ $gpus == 1 && ,$scenarios, == *,search-8gpu,* ]] && ! [[ " $* " == *" --gpus"* ]] && gpus=8
have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
((have >= gpus)) || { echo "gpu/device.sh: $scenarios needs $gpus GPU(s); nvidia-smi lists $have"; exit 5; }
# NVLink multicast stays off (the machine's GPUs are shared); no network: everything offline
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
# twins run many Ray clusters side by side while MemTotal still reads a fraction of the machine's memory (it grows as
# memory is used): Ray's memory monitor, which compares use with MemTotal, would kill workers that fit
[[ ,$scenarios, == *,twins,* ]] && export RAY_memory_monitor_refresh_ms=0
rm -rf /tmp/harness  # a warm machine keeps the last call's scratch folder
python3 -m gpu.bundle install --target /tmp/site > "$result/install.log" 2>&1 || { tail -20 "$result/install.log"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD VERL_USE_EXTERNAL_MODULES=gpu.verl_plugin
# --profile samples the guardians with py-spy: a stripped binary, xz-packed, carried as gpu/.tools/py-spy.xz
mkdir -p /tmp/bin && export PATH=/tmp/bin:$PATH
[[ -f gpu/.tools/py-spy.xz ]] && python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)" \
  gpu/.tools/py-spy.xz > /tmp/bin/py-spy && chmod +x /tmp/bin/py-spy
python3 -m gpu.tiny --out /tmp/tiny > "$result/tiny.log" 2>&1 || { tail -20 "$result/tiny.log"; exit 4; }
search=()
fixture=tests/fixtures/recipe/hotpotqa_train_100.json
if [[ ,$scenarios, == *,search,* || ,$scenarios, == *,search-8gpu,* ]]; then
  # the recipe's scenarios: a corpus from the HotpotQA sample's own paragraphs, and the `guardian` and `ray` commands
  # recipe/run.sh calls (the bundle installs no console scripts)
  python3 -m recipe.search.hotpot_corpus --hotpotqa "$fixture" --out /tmp/search-corpus.jsonl > "$result/search-setup.log" 2>&1 ||
    { tail -20 "$result/search-setup.log"; exit 4; }
  search=(--search-corpus /tmp/search-corpus.jsonl)
fi
if [[ ,$scenarios, == *,search,* ]]; then
  # the tiny search model taught the protocol's shape
  python3 -m gpu.tiny --task search --out /tmp/tiny-search --warm-start "$fixture" --warm-steps 600 >> "$result/search-setup.log" 2>&1 ||
    { tail -20 "$result/search-setup.log"; exit 4; }
  search+=(--search-tiny /tmp/tiny-search)
fi
if [[ ,$scenarios, == *,search-8gpu,* ]]; then
  # Qwen2.5-7B's shape with 4 of its 28 layers (gpu.tiny.QWEN25_7B), random, warm-started on GPU 0, saved in bf16
  CUDA_VISIBLE_DEVICES=0 python3 -m gpu.tiny --task search --shape qwen2.5-7b --layers "${SHAPE_LAYERS:-4}" \
    --out /tmp/shape-search --warm-start "$fixture" --warm-steps "${SHAPE_WARM_STEPS:-300}" >> "$result/search-setup.log" 2>&1 ||
    { tail -20 "$result/search-setup.log"; exit 4; }
  tail -1 "$result/search-setup.log"
  search+=(--search-shape /tmp/shape-search)
fi
if ((${#search[@]})); then
  printf '#!/bin/sh\nexec python3 -m guardian "$@"\n' > /tmp/bin/guardian
  printf '#!/bin/sh\nexec python3 -c "import sys; from ray.scripts.scripts import main; sys.exit(main())" "$@"\n' > /tmp/bin/ray
  chmod +x /tmp/bin/guardian /tmp/bin/ray
  # a head without the dashboard (the bundle's Ray has no dashboard build); run.sh finds it and reuses it. The
  # object store is sized explicitly: these machines' MemTotal starts small and grows as memory is used (KINDS.md),
  # and every step sends each hf replica the whole state dict through it (search-8gpu: 8 x 4 GB in bf16)
  mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  store=$((mem_kb * 1024 / 2)); ((store > 48 * 1024 ** 3)) && store=$((48 * 1024 ** 3))
  ray start --head --include-dashboard=false --object-store-memory="$store" > "$result/ray-start.log" 2>&1 ||
    { tail -20 "$result/ray-start.log"; exit 4; }
fi
{ nvidia-smi; nvidia-smi topo -m; python3 -c "import torch, transformers, ray, verl; print(torch.__version__, transformers.__version__, ray.__version__, verl.__version__)"; } > "$result/machine.txt" 2>&1
python3 -m gpu.device_run --trainer verl --tiny /tmp/tiny --scenarios "$scenarios" --work /tmp/harness --out "$result" \
  ${search[@]+"${search[@]}"} "$@"
rc=$?
((${#search[@]})) && ray stop > /dev/null 2>&1
nvidia-smi --query-gpu=index,memory.used --format=csv > "$result/gpu-after.txt" 2>&1
tar -C "$out" -czf "$out/harness.tar.gz" harness && rm -rf "$result"
exit $rc
