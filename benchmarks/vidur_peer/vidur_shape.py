"""Print, as one JSON object, the shape Vidur knows for a model name (run with the Vidur
venv's python; used by benchmarks/peers/setup to check that the Vidur model it simulates
has andante's model's shape).

Usage: vidur_shape.py [VIDUR_MODEL_NAME]   (default meta-llama/Llama-3-8B)
"""

from __future__ import annotations

import json
import sys

FIELDS = ("num_layers", "num_q_heads", "num_kv_heads", "embedding_dim", "mlp_hidden_dim",
          "vocab_size", "use_gated_mlp", "max_model_len")


def main() -> int:
    from vidur.config.model_config import BaseModelConfig

    name = sys.argv[1] if len(sys.argv) > 1 else "meta-llama/Llama-3-8B"
    try:
        config = BaseModelConfig.create_from_name(name)
    except Exception as exc:  # Vidur raises a bare ValueError/KeyError for unknown names
        print(f"vidur_shape: Vidur does not know the model {name!r}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"name": name, **{f: getattr(config, f) for f in FIELDS}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
