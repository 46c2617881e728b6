"""One bridge per framework: the only places that convert between numpy and torch, JAX, MLX
or TensorFlow arrays. Each imports its framework and ``_base.dtypes`` only."""
