#!/usr/bin/env bash
# A datacenter user's first hour with ftgov on a real NVIDIA GPU, read only: ftgovd on the NVML backend in the
# observe policy (NVML through the read-only handle: no clock, power limit or persistence setting can change), then
# the CLI as the README tours it: doctor, `ftgov run` on a plain PyTorch loop, status while it runs, history, report,
# metrics. Not `ftgov restore`: on NVML a restore resets the clocks' lock, a write this shared GPU must never get.
# Every command's output goes to $OUT (docs/nvml-tour/ keeps one run), with nvidia-smi's settings before and after.
#
#   OUT=DIR [TOUR_TRAIN_S=40] bash scripts/nvml_tour.sh
#
# Needs torch and nvidia-ml-py where python3 finds them, and ftgov's own dependencies on PYTHONPATH.
# Off a GPU it runs against the fake pynvml (FAKENVML_CONFIG=<json: {"gpus": [{}]}>
# PYTHONPATH=tests/support/fakenvml:$PWD), train.py on the CPU. One run on an H100: docs/nvml-observe.md, "A first hour".
set -u
: "${OUT:?set OUT to an output directory}"
TRAIN_S=${TOUR_TRAIN_S:-40}
W=$(mktemp -d /tmp/ftgov-tour.XXXXXX)
export FTGOV_SOCKET=$W/ftgov.sock
mkdir -p "$OUT" "$W/state"
ftgov() { python3 -m governor.cli "$@"; }
step() { echo "\$ $*" >>"$OUT/tour.txt"; "$@" >>"$OUT/tour.txt" 2>&1; echo "[exit $?]" >>"$OUT/tour.txt"; }
settings() { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,persistence_mode \
  --format=csv; nvidia-smi -q -d CLOCK | grep -A3 -i "locked\|applications clocks"; }

cat >"$W/ftgov.yaml" <<EOF
backend: nvml
policy: observe
socket: {path: $W/ftgov.sock, group: root}
state_dir: $W/state
store: {path: $W/state/measurements.sqlite}
EOF
cat >"$W/train.py" <<'EOF'
# A plain PyTorch loop (no ftgov import): a BERT-base-sized encoder on synthetic tokens, for TRAIN_S seconds.
import sys, time
import torch
layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the script off the GPU
model = torch.nn.Sequential(torch.nn.Embedding(30522, 768), torch.nn.TransformerEncoder(layer, 12),
                            torch.nn.Linear(768, 30522)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
end, steps = time.monotonic() + float(sys.argv[1]), 0
while time.monotonic() < end:
    x = torch.randint(0, 30522, (32, 128), device=dev)
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    opt.zero_grad(); loss.backward(); opt.step(); steps += 1
torch.cuda.synchronize() if dev == "cuda" else None
print(f"train.py: {steps} steps")
EOF

settings >"$OUT/settings-before.txt" 2>&1
python3 -c 'from governor.daemon.entry import main; main()' --config "$W/ftgov.yaml" >"$OUT/ftgovd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$W/ftgov.sock" ] && break; sleep 0.1; done  # a script's wait, not a test's

step ftgov doctor --config "$W/ftgov.yaml"
step ftgov status
ftgov run -v --model-type encoder --num-layers 12 --hidden-size 768 --seq-len 128 -- \
  python3 "$W/train.py" "$TRAIN_S" >"$OUT/run.txt" 2>&1 &
run=$!
sleep $((TRAIN_S / 2))
step ftgov status
step ftgov status --json
step ftgov metrics --textfile "$OUT/ftgov.prom" --once
wait $run; echo "[ftgov run exit $?]" >>"$OUT/run.txt"
step ftgov history
step ftgov history --json
step ftgov report --out "$OUT/report"
kill -TERM $daemon; wait $daemon; echo "[ftgovd exit $?]" >>"$OUT/ftgovd.log"
settings >"$OUT/settings-after.txt" 2>&1
rm -rf "$W"
