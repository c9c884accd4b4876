#!/usr/bin/env python3
"""Build offline profiling datasets for vidur 0.0.26 (Llama-2-7B, A100, TP1).

vidur 0.0.26 (PyPI) fetches its profiling CSVs with huggingface_hub.snapshot_download
from HF datasets (default project-vajra/dev-staging-*), which fails offline.  This
script writes an equivalent dataset into an HF-hub-style cache so that
snapshot_download(..., cache_dir=<cache>/profiling_data/{compute,network}/) resolves
offline (HF_HUB_OFFLINE=1, refs/main -> snapshots/<hash>/).

The numbers are NOT a full copy of Microsoft's profile.  They are built from rows
transcribed by hand from Microsoft's MIT-licensed vidur profiling data
(<anchors>/*.csv, see <anchors>/SOURCE.md; kept outside the repository, by
default $ANDANTE_PEERS/vidur-data/anchors), then densified:
  * linear ops (mlp.csv): per-op linear interpolation in num_tokens between the
    transcribed rows of data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv;
  * decode attention: piecewise-linear interpolation in (batch, kv) between the
    transcribed rows of the same model's attention.csv;
  * prefill attention: least-squares fit of t = c0 + c1*q + c2*q*kv + c3*q^2 to the
    transcribed prefill rows, evaluated on a dense (chunk, kv) grid.
Only TP1 / block_size 16 rows are produced.

Usage: make_profile.py ANCHORS_DIR CACHE_DIR
Vidur caches trained predictors and predictions under CACHE_DIR keyed by its config
hash, not by the data, so regenerating the data clears those caches.
"""

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import pandas as pd

ANCHORS = ""  # set by main(): the folder with the transcribed anchor rows

MODEL = "meta-llama/Llama-2-7b-hf"
DEVICE = "a100"
NETWORK = "a100_dgx"
COMPUTE_REPO = "offline/vidur-a100-llama-2-7b-hf"
NETWORK_REPO = "offline/vidur-a100-dgx"

MODEL_COLS = dict(
    n_head=32,
    n_kv_head=32,
    n_embd=4096,
    n_expanded_embd=11008,
    vocab_size=32768,
    use_gated_mlp=True,
)
OPS = [
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
    "mlp_act",
    "input_layernorm",
    "post_attention_layernorm",
    "attn_rope",
    "add",
]


def mlp_table() -> pd.DataFrame:
    a = pd.read_csv(os.path.join(ANCHORS, "mlp_tp1.csv")).sort_values("num_tokens")
    a = a.drop_duplicates("num_tokens")
    tokens = np.arange(1, 4097)
    df = pd.DataFrame({"num_tokens": tokens})
    for op in OPS:
        df[f"time_stats.{op}.median"] = np.interp(tokens, a["num_tokens"], a[op])
    for k, v in MODEL_COLS.items():
        df[k] = v
    df["num_tensor_parallel_workers"] = 1
    return df


def _lstsq(X, y):
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef


def _interp_extrap(x, xp, fp):
    """np.interp with linear extrapolation from the two end segments."""
    xp, fp = np.asarray(xp, float), np.asarray(fp, float)
    y = np.interp(x, xp, fp)
    lo, hi = x < xp[0], x > xp[-1]
    y = np.where(lo, fp[0] + (x - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0]), y)
    y = np.where(hi, fp[-1] + (x - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2]), y)
    return y


def decode_model(dec: pd.DataFrame):
    """Decode attention t(b, kv): piecewise linear in b at three measured kv levels
    (32, 1728, 3264; the few rows measured at kv 1664 / 3200 are rescaled to the
    nearest level in proportion to kv), then piecewise linear in kv, extrapolated
    linearly above 3264."""
    levels = {32: 32, 1728: 1728, 1664: 1728, 3264: 3264, 3200: 3264}
    curves = {}
    for kv_meas, g in dec.groupby("kv_cache_size"):
        lvl = levels[int(kv_meas)]
        t = g.time.values * (lvl / kv_meas if lvl != kv_meas else 1.0)
        curves.setdefault(lvl, []).extend(zip(g.batch_size.values, t, strict=True))
    lv = sorted(curves)
    pts = {k: np.array(sorted(v)) for k, v in curves.items()}

    def f(b, kv):
        b, kv = np.asarray(b, float).ravel(), np.asarray(kv, float).ravel()
        per_level = np.stack([_interp_extrap(b, pts[k][:, 0], pts[k][:, 1]) for k in lv])
        out = np.empty(b.size)
        for i in range(b.size):
            out[i] = _interp_extrap(kv[i : i + 1], lv, per_level[:, i])[0]
        return out

    return f


def attention_table() -> tuple[pd.DataFrame, dict]:
    dec = pd.read_csv(os.path.join(ANCHORS, "attn_decode_tp1.csv"))
    pre = pd.read_csv(os.path.join(ANCHORS, "attn_prefill_tp1.csv"))
    fdec = decode_model(dec)
    # prefill: t = c0 + c1*q + c2*q*kv + c3*q^2   (q = chunk, kv = cached context)
    q, kv = pre.prefill_chunk_size.values.astype(float), pre.kv_cache_size.values.astype(float)
    Xp = np.c_[np.ones(len(pre)), q, q * kv, q * q]
    w = 1.0 / pre.time.values  # minimise relative error
    cp = _lstsq(Xp * w[:, None], pre.time.values * w)
    fit = {
        "decode": "piecewise-linear interpolation of measured rows",
        "prefill_coef[1,q,q*kv,q^2]": cp.tolist(),
        "prefill_rel_err_median": float(np.median(np.abs(Xp @ cp / pre.time.values - 1))),
        "prefill_rel_err_max": float(np.max(np.abs(Xp @ cp / pre.time.values - 1))),
    }

    kvs = np.arange(64, 4097, 64)
    bs = np.arange(1, 129)
    B, K = np.meshgrid(bs, kvs, indexing="ij")
    T = fdec(B.ravel().astype(float), K.ravel().astype(float))
    decode = pd.DataFrame(
        {
            "batch_size": B.ravel(),
            "prefill_chunk_size": 0,
            "kv_cache_size": K.ravel(),
            "is_prefill": False,
            "time_stats.attn_decode.median": np.maximum(T, 1e-3),
            "time_stats.attn_prefill.median": np.nan,
        }
    )
    rows = []
    for qv in np.arange(32, 4097, 32):
        for kvv in np.r_[0, kvs]:
            if kvv + qv > 4096:
                continue
            t = cp[0] + cp[1] * qv + cp[2] * qv * kvv + cp[3] * qv * qv
            rows.append((1, int(qv), int(kvv), True, np.nan, max(t, 1e-3)))
    prefill = pd.DataFrame(rows, columns=decode.columns)
    df = pd.concat([decode, prefill], ignore_index=True)
    df["time_stats.attn_kv_cache_save.median"] = 0.0  # absent from the old-format profile
    df["n_embd"] = 4096
    df["n_q_head"] = 32
    df["n_kv_head"] = 32
    df["block_size"] = 16
    df["num_tensor_parallel_workers"] = 1
    df["max_model_len"] = 4096
    fit["decode_check_ms"] = {
        f"b{b}_kv{k}": round(float(fdec(np.array([float(b)]), np.array([float(k)]))[0]), 4)
        for b, k in [(1, 1024), (32, 1024), (64, 2048), (128, 4096)]
    }
    return df, fit


def network_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    # Only read for TP>1 / PP>1; TP1-PP1 never loads them, but the files must exist.
    sizes = 2 ** np.arange(10, 28)
    ar = pd.DataFrame(
        {
            "size": sizes,
            "num_workers": 2,
            "devices_per_node": 2,
            "collective": "all_reduce",
            "time_stats.all_reduce.median": 0.01 + sizes / 150e9 * 1e3,
        }
    )
    sr = pd.DataFrame(
        {
            "size": sizes,
            "num_workers": 2,
            "devices_per_node": 2,
            "collective": "send_recv",
            "time_stats.send_recv.median": 0.01 + sizes / 150e9 * 1e3,
        }
    )
    return ar, sr


def write_snapshot(cache_dir: str, repo_id: str, files: dict) -> str:
    storage = os.path.join(cache_dir, "datasets--" + repo_id.replace("/", "--"))
    blob = hashlib.sha1(repr(sorted(files)).encode()).hexdigest()
    snap = os.path.join(storage, "snapshots", blob)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(storage, "refs"), exist_ok=True)
    with open(os.path.join(storage, "refs", "main"), "w") as f:
        f.write(blob)
    for name, content in files.items():
        path = os.path.join(snap, name)
        if isinstance(content, pd.DataFrame):
            content.to_csv(path, index=False, compression="xz" if name.endswith(".xz") else None)
        else:
            with open(path, "w") as f:
                json.dump(content, f, indent=2)
    return snap


def main(anchors: str, cache_dir: str) -> None:
    global ANCHORS
    ANCHORS = anchors
    for stale in ("predictors", "predictions", "training_predictions", "hf_predictions"):
        shutil.rmtree(os.path.join(cache_dir, stale), ignore_errors=True)
    mlp = mlp_table()
    attn, fit = attention_table()
    ar, sr = network_tables()
    c = write_snapshot(
        os.path.join(cache_dir, "profiling_data", "compute"),
        COMPUTE_REPO,
        {
            "config.json": {
                "model": MODEL,
                "device_sku": DEVICE,
                "note": "offline reconstruction, see make_profile.py",
                "fit": fit,
            },
            "mlp.csv.xz": mlp,
            "attention.csv.xz": attn,
        },
    )
    n = write_snapshot(
        os.path.join(cache_dir, "profiling_data", "network"),
        NETWORK_REPO,
        {
            "config.json": {"sku": NETWORK, "note": "placeholder, unused at TP1/PP1"},
            "all_reduce.csv.xz": ar,
            "send_recv.csv.xz": sr,
        },
    )
    print(
        json.dumps(
            {
                "compute": c,
                "network": n,
                "mlp_rows": len(mlp),
                "attention_rows": len(attn),
                "fit": fit,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
