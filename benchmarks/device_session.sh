#!/usr/bin/env bash
# The GPU measurements of issues 8 and 10 in one lease of a lent GPU machine (../shared/gpu/README.md).
# Run from the repository root there, with onnxruntime-gpu brought over in parts (.ortgpu1/ with the
# first part and onnxconverter-common's wheel, .ortgpu2/ with the second, both made here beforehand by
# `python benchmarks/pack_ortgpu.py`; each carried by its call):
#
#   benchmarks/device_session.sh prepare   # first call: keeps the first part; makes and converts the
#                                          # benchmark models on the CPU (gpu_bench --prepare-only)
#   benchmarks/device_session.sh train     # last part: assembles and unpacks onnxruntime-gpu, checks that
#                                          # the CUDA provider runs, times the training steps (train_bench)
#   benchmarks/device_session.sh fuzz      # instead of train: the fuzz cases of gpu_fuzz.py prepare (carried
#                                          # as benchmarks/work/gpu_fuzz; or CASES, a folder of cases such as
#                                          # torch_exports.py cases writes) run on CUDA, NaN/Inf and error counted
#   benchmarks/device_session.sh exports   # instead of train: exports BERT, GPT, Llama and T5 at BERT-base's shape
#                                          # (torch_exports.py export --size base; EXPORTS narrows them), converts
#                                          # each with amp-rewrite and the ORT float16 script, times all three on
#                                          # CUDA (amp-rewrite bench, batch 32, sequence 128); OLD, a folder holding
#                                          # an earlier amp_rewrite package (carried), converts with it too, and
#                                          # then each conversion's error on CUDA is measured (amp-rewrite check)
#   benchmarks/device_session.sh infer     # times inference (gpu_bench) and checks the CUDA kernel table
#   benchmarks/device_session.sh run CMD   # any command (a diagnosis) with onnxruntime-gpu set up by train
#
# Each stage leaves its results in /tmp/res and packs them into $OUT/results.tgz. The machine keeps /tmp
# only while it stays warm, so the calls go back to back.
#
# A shorter session (a rerun of some cases) narrows it with variables: ONLY (gpu_bench's cases whose
# name holds one of these; space-separated, "_" for a space: "squeezenet_b1"; prepare and infer),
# BATCHES (train_bench's batches), TRAIN_ARGS (more of train_bench's arguments), PRECISIONS (kernel_check's,
# space-separated; default float16), CASES and FUZZ_ARGS (gpu_fuzz.py run's folder and more arguments).
set -u
stage=$1
shift
only=()
for case in ${ONLY:-}; do only+=(--only "${case//_/ }"); done
res=/tmp/res
mkdir -p /tmp/parts "$res"
pack() { tar czf "$OUT/results.tgz" -C "$res" . 2>/dev/null; }
export PYTHONUNBUFFERED=1

cp .ortgpu*/part.* /tmp/parts/ 2>/dev/null
ls -la /tmp/parts
if [ -n "$(ls .ortgpu*/*.whl 2>/dev/null)" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .ortgpu*/*.whl
fi

# CUDA 13 libraries from the nvidia pip packages that PyTorch brings
LD_LIBRARY_PATH=$(python3 -c '
import glob, os, sys
found = {os.path.dirname(f) for p in sys.path if p for f in glob.glob(os.path.join(p, "nvidia", "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(found)))'):${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH
if [ -d /tmp/ortgpu/onnxruntime ]; then
  export PYTHONPATH=/tmp/ortgpu:/tmp/site:$PWD
else
  export PYTHONPATH=/tmp/site:$PWD
fi

case $stage in
prepare)
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$res/gpu.txt"
  python3 -c 'import onnx, onnxruntime, numpy, torch; print("onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, "numpy", numpy.__version__, "torch", torch.__version__)' | tee -a "$res/gpu.txt"
  timeout 150 python3 benchmarks/gpu_bench.py --prepare-only "${only[@]}" --jobs 16 --work /tmp/gpuwork --out "$res/gpu" 2>&1 \
    | grep -v -i "warn" | tee "$res/prepare.log" | tail -20
  du -sh /tmp/gpuwork
  ;;
train|fuzz|exports)
  cat /tmp/parts/part.* > /tmp/ort.tar.xz && sha256sum /tmp/ort.tar.xz | tee -a "$res/gpu.txt"
  mkdir -p /tmp/ortgpu && tar -xJf /tmp/ort.tar.xz -C /tmp/ortgpu && export PYTHONPATH=/tmp/ortgpu:/tmp/site:$PWD
  python3 - <<'EOF' 2>&1 | tee -a "$res/gpu.txt"
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
print(ort.__file__, ort.__version__, ort.get_available_providers())
graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "smoke",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [64, 64]) for n in "ab"],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT16, [64, 64])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
s = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
a = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float16)
got = s.run(None, {"a": a, "b": a})[0]
print("smoke: providers", s.get_providers(), "max error", float(np.abs(got.astype(np.float32) - a.astype(np.float32) @ a.astype(np.float32)).max()))
EOF
  if [ "$stage" = exports ]; then
    python3 benchmarks/torch_exports.py export --size base --only ${EXPORTS:-bert gpt llama t5} --out /tmp/exports \
      2>&1 | grep "^exported\|^not exported"
    for model in /tmp/exports/*_op17.onnx; do
      stem=$(basename "${model%.onnx}")
      python3 -m amp_rewrite convert "$model" -o "/tmp/exports/$stem.amp.onnx" --quiet --report "$res/$stem.convert.json"
      python3 benchmarks/peer_convert.py ort "$model" "/tmp/exports/$stem.ort.onnx"
      kinds="amp ort"
      if [ -n "${OLD:-}" ]; then
        (cd "$OLD" && python3 -m amp_rewrite convert "$model" -o "/tmp/exports/$stem.old.onnx" --quiet \
          --report "$res/$stem.old.convert.json")  # run from there, its package comes first
        kinds="amp old ort"
      fi
      timeout 200 python3 -m amp_rewrite bench "$model" $(for k in $kinds; do echo "/tmp/exports/$stem.$k.onnx"; done) \
        --provider CUDAExecutionProvider --random 1 --shape ids:32x128 --runs 200 --report "$res/$stem.bench.json" \
        > "$res/$stem.bench.txt" 2>&1
      if [ -n "${OLD:-}" ]; then
        for k in $kinds; do
          timeout 60 python3 -m amp_rewrite check "$model" "/tmp/exports/$stem.$k.onnx" --provider CUDAExecutionProvider \
            --random 1 --shape ids:4x128 > "$res/$stem.$k.check.txt" 2>&1
          echo "$stem $k"; head -4 "$res/$stem.$k.check.txt"
        done
      fi
      python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
for m in r["models"]: print(sys.argv[2], m["label"], "median %.3f p10 %.3f p90 %.3f speed-up %.2f device MiB %s" % (m["median_ms"], m["p10_ms"], m["p90_ms"], m["speedup"], m["device_memory_mib"]))
print(sys.argv[2], "failed", r["failed"])' "$res/$stem.bench.json" "$stem" || tail -3 "$res/$stem.bench.txt"
    done
  elif [ "$stage" = fuzz ]; then
    timeout "${FUZZ_SECONDS:-300}" python3 benchmarks/gpu_fuzz.py run --cases "${CASES:-benchmarks/work/gpu_fuzz}" ${FUZZ_ARGS:-} \
      --out "$res/gpu_fuzz.json" 2>&1 | grep -v -i "warn" | tail -40
  else
    timeout 280 python3 benchmarks/train_bench.py --batches "${BATCHES:-256,32,64,128,512}" ${TRAIN_ARGS:-} --out "$res/train_bench.md" 2>&1 | grep -v -i "warn" | tail -12
    cp benchmarks/RESULTS.md "$res/RESULTS.train.md"
  fi
  ;;
infer)
  timeout 240 python3 benchmarks/gpu_bench.py "${only[@]}" --work /tmp/gpuwork --out "$res/gpu" --jobs 12 --warmup 10 --runs 100 \
    --deadline 150 2>&1 | grep -v -i "warn" | tail -40
  pack
  for precision in ${PRECISIONS:-float16}; do
    for k in 0 1 2 3 4 5 6 7; do
      timeout 100 python3 benchmarks/kernel_check.py --provider CUDAExecutionProvider --precision "$precision" \
        --shard $k/8 --out "$res/kc-$precision-$k" > "$res/kc-$precision-$k.log" 2>&1 &
    done
    wait
    tail -n 1 "$res"/kc-"$precision"-*.log
    grep -h "^disagree" "$res"/kc-"$precision"-*.log
  done
  ;;
run)
  "$@"
  ;;
esac
pack
ls -la "$OUT"
