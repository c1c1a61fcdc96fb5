"""Run by the MaxText venv's Python (tests/python/test_maxtext_peer.py starts it): MaxText 0.2.5
loads a parameter-only checkpoint the way its inference and RL tools do
(model_creation_utils.from_pretrained, load_parameters_path=...), takes the synthetic batch its
train would, and writes the logits of one forward pass and its cross-entropy loss.

    python maxtext_forward.py OUT.npz base.yml key=value ... load_parameters_path=CKPT/items

OUT.npz holds inputs and targets [batch, seq] int32, logits [batch, seq, vocab] float32 and loss
(MaxText's cross_entropy_with_logits, mean over the targets).
"""
import sys

import jax
import numpy as np


def main(out, argv):
    # MaxText's train sets this; its synthetic tokens depend on it.
    jax.config.update("jax_default_prng_impl", "unsafe_rbg")
    from jax.sharding import Mesh

    from maxtext.configs import pyconfig
    from maxtext.input_pipeline.synthetic_data_processing import SyntheticDataIterator
    from maxtext.utils import max_utils, maxtext_utils, model_creation_utils

    config = pyconfig.initialize([sys.argv[0]] + argv)
    mesh = Mesh(maxtext_utils.create_device_mesh(config), config.mesh_axes)
    model = model_creation_utils.from_pretrained(config, mesh=mesh)
    data = next(SyntheticDataIterator(config, mesh))
    with mesh:
        logits = model(decoder_input_tokens=data["inputs"], decoder_positions=data["inputs_position"],
                       decoder_segment_ids=data["inputs_segmentation"], enable_dropout=False)
        one_hot = jax.nn.one_hot(data["targets"], config.vocab_size)
        xent, _ = max_utils.cross_entropy_with_logits(logits, one_hot, z_loss=0.0)
    np.savez(out, inputs=np.asarray(data["inputs"]), targets=np.asarray(data["targets"]),
             logits=np.asarray(logits, dtype=np.float32), loss=np.float64(np.mean(np.asarray(xent, np.float64))))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
