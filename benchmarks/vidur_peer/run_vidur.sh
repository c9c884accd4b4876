#!/usr/bin/env bash
# Vidur (PyPI vidur==0.0.26), the simulator peer, on the model andante simulates:
# andante's llama-3.1-8b on one a100-80g, given to Vidur as meta-llama/Llama-3-8B (same
# shape) with a profiling dataset written from andante's cost model, and andante's
# engine settings (vLLM scheduler, batch cap, token budget, KV blocks). Prints one JSON
# line (vidur_bench.py). benchmarks/sim_vs_vidur.py runs it next to every andante policy.
#
# Needs, from `benchmarks/peers/setup --only vidur` (under $ANDANTE_PEERS, default
# runs/peers in this checkout):
#   $VIDUR_VENV  (default $ANDANTE_PEERS/vidur-venv)  vidur==0.0.26
#   $VIDUR_DATA  (default $ANDANTE_PEERS/vidur-data)  cache/profiling_data (the dataset)
#                and vidur_args.txt (the flags that select it)
# Fails (exit 1, a message) when any of them or the request lengths are missing.
#
# Usage: run_vidur.sh [NUM_REQUESTS] [QPS] [MODE] [extra vidur flags...]
#   Requests: NUM_REQUESTS (default 10000) Poisson arrivals at QPS (default 1.5) with
#   ShareGPT lengths ($VIDUR_LENGTHS, default ../shared/traces/sharegpt_lengths/...);
#   or, with VIDUR_TRACE=FILE, exactly the requests of FILE (columns Date=2023-08-21,
#   Time, PromptTokenCount, CompletionTokenCount; NUM_REQUESTS and QPS then unused).
#   MODE: minimal (default) request metrics only, no plots/traces
#         off      all metrics off (--no-metrics_config_write_metrics)
#         native   as off, plus Vidur's C++ execution-time predictor
#         default  Vidur's defaults (metrics CSVs + plots + chrome trace)
#   The first run trains Vidur's random forests on the dataset (minutes) and caches them.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PEERS=${ANDANTE_PEERS:-$HERE/../../runs/peers}
VIDUR_VENV=${VIDUR_VENV:-$PEERS/vidur-venv}
VIDUR_DATA=${VIDUR_DATA:-$PEERS/vidur-data}
N=${1:-10000}
QPS=${2:-1.5}
MODE=${3:-minimal}
shift $(( $# < 3 ? $# : 3 ))

fail() { echo "run_vidur: error: $*" >&2; exit 1; }
SETUP_HINT="run benchmarks/peers/setup --only vidur (with ANDANTE_PEERS=$PEERS)"

PY="$VIDUR_VENV/bin/python"
if [[ ! -x "$PY" ]] || ! "$PY" -c "import vidur" 2>/dev/null; then
  fail "no Vidur venv at $VIDUR_VENV: $SETUP_HINT"
fi
ARGS_FILE="$VIDUR_DATA/vidur_args.txt"
if [[ ! -f "$ARGS_FILE" ]] || ! compgen -G "$VIDUR_DATA/cache/profiling_data/compute/datasets--*/refs/main" >/dev/null; then
  fail "no Vidur profiling dataset under $VIDUR_DATA: $SETUP_HINT"
fi
mapfile -t DATA_ARGS < "$ARGS_FILE"

if [[ -n "${VIDUR_TRACE:-}" ]]; then
  [[ -f "$VIDUR_TRACE" ]] || fail "VIDUR_TRACE=$VIDUR_TRACE is not a file"
  REQUESTS=(--request_generator_config_type trace_replay
            --trace_request_generator_config_trace_file "$VIDUR_TRACE"
            --trace_request_generator_config_prefill_scale_factor 1
            --trace_request_generator_config_decode_scale_factor 1
            --trace_request_generator_config_time_scale_factor 1)
else
  LENGTHS=${VIDUR_LENGTHS:-$HERE/../../../shared/traces/sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv}
  [[ -f "$LENGTHS" ]] || fail "ShareGPT lengths CSV not found at $LENGTHS (set VIDUR_LENGTHS)"
  REQUESTS=(--request_generator_config_type synthetic
            --synthetic_request_generator_config_num_requests "$N"
            --length_generator_config_type trace
            --trace_request_length_generator_config_trace_file "$LENGTHS"
            --interval_generator_config_type poisson
            --poisson_request_interval_generator_config_qps "$QPS")
fi

# Offline: huggingface_hub resolves the profiling "datasets" from the cache (refs/main).
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled OMP_WAIT_POLICY=PASSIVE
RUN_DIR="$VIDUR_DATA/run"
mkdir -p "$RUN_DIR"
P=random_forrest_execution_time_predictor_config

case "$MODE" in
  minimal) METRICS=(--no-metrics_config_store_plots --no-metrics_config_enable_chrome_trace
                    --no-metrics_config_store_batch_metrics --no-metrics_config_store_utilization_metrics) ;;
  off)     METRICS=(--no-metrics_config_write_metrics --no-metrics_config_store_plots
                    --no-metrics_config_enable_chrome_trace) ;;
  native)  METRICS=(--no-metrics_config_write_metrics --no-metrics_config_store_plots
                    --no-metrics_config_enable_chrome_trace --${P}_use_native_execution_time_predictor) ;;
  default) METRICS=() ;;
  *) echo "run_vidur: unknown MODE $MODE (minimal, off, native or default)" >&2; exit 2 ;;
esac

# Training grid cut to one setting (Vidur's default searches 27): minutes, not hours.
# The predictions are precomputed look-ups, so the grid does not change loop speed.
cd "$RUN_DIR"
exec "$PY" "$HERE/vidur_bench.py" \
  --seed 42 \
  "${DATA_ARGS[@]}" \
  "${REQUESTS[@]}" \
  --${P}_num_estimators 100 --${P}_max_depth 16 --${P}_min_samples_split 2 \
  --${P}_k_fold_cv_splits 2 --${P}_num_training_job_threads 2 \
  --metrics_config_output_dir "$RUN_DIR/out" \
  "${METRICS[@]}" "$@"
