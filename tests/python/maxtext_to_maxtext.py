"""Run by the MaxText venv's Python (tests/python/test_maxtext_converter.py and
bench/maxtext_convert_bench.py start it): MaxText 0.2.5's own Hugging Face converter,
maxtext.checkpoint_conversion.to_maxtext, run as its command line runs it, on a local model.

    python maxtext_to_maxtext.py MODEL_NAME HF_DIR [to_maxtext's arguments ...]

to_maxtext builds its key and hook tables from the published model's Hugging Face config
(HF_MODEL_CONFIGS[model_name]: the layer count, head_dim, experts), whatever the local model is;
for a smaller model of the family those tables must come from the model's own config.json, so
that entry is replaced by it before the module runs. Nothing else of MaxText is changed.
"""
import runpy
import sys

import transformers
from maxtext.checkpoint_conversion.utils import hf_model_configs


def main(model_name, hf_dir, args):
    hf_model_configs.HF_MODEL_CONFIGS[model_name] = transformers.AutoConfig.from_pretrained(hf_dir)
    sys.argv = ["to_maxtext"] + args
    runpy.run_module("maxtext.checkpoint_conversion.to_maxtext", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
