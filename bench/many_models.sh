#!/usr/bin/env bash
# Threads, RSS and ready time of BIN serving N copies of the peers' add_sub (one instance each): idle,
# right after one request to each of 50 of them, and 2.5 s later. Usage: bench/many_models.sh BIN N
set -euo pipefail
bin=$1 n=$2
repo=/tmp/many-$n
if [ ! -d $repo ]; then
  mkdir -p $repo
  src=$HOME/.cache/kiln-peers/kiln/best/add_sub
  for i in $(seq 0 $((n-1))); do
    mkdir -p $repo/m$i/1
    ln -s $src/1/model.onnx $repo/m$i/1/model.onnx
    sed -e "s/^name: .*/name: \"m$i\"/" -e 's/count: 2/count: 1/' $src/config.pbtxt > $repo/m$i/config.pbtxt
  done
fi
export ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-$(cd "$(dirname "$0")/.." && pwd)/.kiln/onnxruntime/libonnxruntime.so}
start=$(date +%s.%N)
"$bin" --model-repository $repo --http-port 8850 --grpc-port 8851 --metrics-port 8852 > /tmp/many.log 2>&1 &
pid=$!
until curl -sf localhost:8850/v2/health/ready >/dev/null; do sleep 0.05; done
ready=$(echo "$(date +%s.%N) - $start" | bc)
sleep 1
idle_threads=$(ls /proc/$pid/task | wc -l); rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
body='{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},{"name":"INPUT1","datatype":"FP32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}'
curls=()
for i in $(seq 0 $((n < 50 ? n-1 : 49))); do curl -sf -XPOST localhost:8850/v2/models/m$i/infer -d "$body" > /dev/null & curls+=($!); done
wait "${curls[@]}"
busy_threads=$(ls /proc/$pid/task | wc -l)
sleep 2.5
after_threads=$(ls /proc/$pid/task | wc -l)
echo "$(basename $bin) models=$n ready=${ready}s rss=$((rss/1024))MB threads idle=$idle_threads after-50-requests=$busy_threads 2.5s-later=$after_threads"
kill $pid; wait $pid 2>/dev/null || true
