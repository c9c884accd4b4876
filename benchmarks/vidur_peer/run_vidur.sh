#!/usr/bin/env bash
# Vidur (PyPI vidur==0.0.26) speed as the simulator peer: N Poisson requests, ShareGPT
# lengths, one A100 replica, Llama-2-7B TP1, vLLM scheduler. Prints one JSON line per run.
#
# Needs (under $ANDANTE_PEERS, default runs/peers in this checkout; see README.md):
#   $VIDUR_VENV  (default $ANDANTE_PEERS/vidur-venv)  a venv with `pip install vidur==0.0.26`
#   $VIDUR_DATA  (default $ANDANTE_PEERS/vidur-data)  anchors/*.csv: profiling rows from
#                Microsoft's Vidur data (see README.md); make_profile.py (here) builds
#                $VIDUR_DATA/cache from them on first use
# Fails with a message (exit 1) when either is missing.
#
# Usage: run_vidur.sh [NUM_REQUESTS] [QPS] [MODE] [extra vidur flags...]
#   MODE: minimal (default) request metrics only, no plots/traces
#         off      all metrics off (--no-metrics_config_write_metrics)
#         native   as off, plus Vidur's C++ execution-time predictor
#         default  Vidur's defaults (metrics CSVs + plots + chrome trace)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PEERS=${ANDANTE_PEERS:-$HERE/../../runs/peers}
VIDUR_VENV=${VIDUR_VENV:-$PEERS/vidur-venv}
VIDUR_DATA=${VIDUR_DATA:-$PEERS/vidur-data}
N=${1:-10000}
QPS=${2:-1.5}
MODE=${3:-minimal}
shift $(( $# < 3 ? $# : 3 ))

PY="$VIDUR_VENV/bin/python"
if [[ ! -x "$PY" ]] || ! "$PY" -c "import vidur" 2>/dev/null; then
  echo "run_vidur: no Vidur venv at $VIDUR_VENV (python -m venv $VIDUR_VENV && $VIDUR_VENV/bin/pip install vidur==0.0.26)" >&2
  exit 1
fi
if [[ ! -f "$VIDUR_DATA/anchors/mlp_tp1.csv" ]]; then
  echo "run_vidur: no profiling anchors at $VIDUR_DATA/anchors (see $HERE/README.md)" >&2
  exit 1
fi
LENGTHS=${VIDUR_LENGTHS:-}
if [[ -z "$LENGTHS" ]]; then
  f="$HERE/../../../shared/traces/sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
  [[ -f "$f" ]] && LENGTHS=$f
fi
if [[ -z "$LENGTHS" || ! -f "$LENGTHS" ]]; then
  echo "run_vidur: ShareGPT lengths CSV not found (set VIDUR_LENGTHS)" >&2
  exit 1
fi

CACHE="$VIDUR_DATA/cache"
if [[ ! -d "$CACHE/profiling_data/compute" ]]; then
  "$PY" "$HERE/make_profile.py" "$VIDUR_DATA/anchors" "$CACHE" >/dev/null
fi

# Offline: huggingface_hub resolves the profiling "datasets" from $CACHE (refs/main).
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
  *) echo "unknown MODE $MODE" >&2; exit 2 ;;
esac

cd "$RUN_DIR"
exec "$PY" "$HERE/vidur_bench.py" \
  --seed 42 \
  --replica_config_model_name meta-llama/Llama-2-7b-hf \
  --replica_config_device a100 --replica_config_network_device a100_dgx \
  --replica_config_tensor_parallel_size 1 --replica_config_num_pipeline_stages 1 \
  --cluster_config_num_replicas 1 \
  --replica_scheduler_config_type vllm \
  --vllm_scheduler_config_batch_size_cap 128 --vllm_scheduler_config_max_tokens_in_batch 4096 \
  --request_generator_config_type synthetic \
  --synthetic_request_generator_config_num_requests "$N" \
  --length_generator_config_type trace \
  --trace_request_length_generator_config_trace_file "$LENGTHS" \
  --trace_request_length_generator_config_max_tokens 4096 \
  --interval_generator_config_type poisson \
  --poisson_request_interval_generator_config_qps "$QPS" \
  --execution_time_predictor_config_type random_forrest \
  --${P}_model_profiling_dataset offline/vidur-a100-llama-2-7b-hf \
  --${P}_network_profiling_dataset offline/vidur-a100-dgx \
  --${P}_cache_dir "$CACHE" \
  --${P}_prediction_max_tokens_per_request 4096 \
  --${P}_num_estimators 250 --${P}_max_depth 16 --${P}_min_samples_split 2 \
  --${P}_k_fold_cv_splits 2 --${P}_num_training_job_threads 2 \
  --metrics_config_output_dir "$RUN_DIR/out" \
  "${METRICS[@]}" "$@"
