"""Eight CPU devices for sharding tests; float32 matmuls at full precision."""

import os

# Must be set before jax is imported anywhere in the test session.
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')
