"""A small convolutional network: two convolutions, max pooling, a dense classifier."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def init_convnet(channels=(3, 8, 16), classes=10, seed=0):
    rng = np.random.default_rng(seed)
    convs = [(rng.normal(size=(3, 3, cin, cout)) / np.sqrt(9 * cin)).astype(np.float32)
             for cin, cout in zip(channels[:-1], channels[1:], strict=True)]
    dense = (rng.normal(size=(channels[-1], classes)) / np.sqrt(channels[-1])).astype(np.float32)
    return {"convs": convs, "dense": dense}


def convnet(params, images):  # images: [batch, height, width, channels]
    x = images
    for kernel in params["convs"]:
        x = lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = jax.nn.relu(x)
        x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    x = jnp.mean(x, axis=(1, 2))
    return x @ params["dense"]
