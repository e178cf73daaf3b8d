"""Saving replicated arrays: Orbax divides only a large one among its
replicas (each writes a slice, cut on its device); a small one is written
whole, at no compile. Both restore exactly."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.train import checkpoint


def _replicated(shape):
  """An array of ``shape`` on every one of the 8 host devices."""
  mesh = jax.make_mesh((8,), ('data',))
  values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  return jax.device_put(values, NamedSharding(mesh, PartitionSpec()))


def _save_and_restore(workdir, params, caplog):
  """The compiles the save logged, each array's written shape (Orbax's
  metadata: a replica's slice or the whole) and the params restored."""
  state = {'params': params, 'step': jnp.int32(1)}
  saver = checkpoint.Checkpointer(str(workdir), async_save=False)
  caplog.clear()
  with jax.log_compiles(), caplog.at_level(logging.WARNING):
    saver.save(state, {'position': 1})
  compiles = [r.getMessage() for r in caplog.records
              if 'ompil' in r.getMessage()]
  saved = ocp.StandardCheckpointHandler().metadata(
      saver.paths.checkpoint(1) / 'params')
  written = {name: tuple(meta.storage.write_shape)
             for name, meta in saved.tree.items()}
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      state)
  restored, _ = saver.restore(abstract)
  saver.close()
  return compiles, written, restored['params']


def test_small_arrays_are_saved_whole_and_large_ones_divided(tmp_path,
                                                             caplog):
  small = {'w': _replicated((64, 32)), 'b': _replicated((32,))}
  compiles, written, restored = _save_and_restore(tmp_path / 'small', small,
                                                  caplog)
  assert written == {'w': (64, 32), 'b': (32,)}
  assert compiles == []
  for name, array in small.items():
    np.testing.assert_array_equal(restored[name], array)
  # 8 MiB over 8 replicas: each writes its megabyte.
  rows = 8 * checkpoint.MIN_REPLICA_SLICE_BYTES // (4 * 256)
  large = {'w': _replicated((rows, 256))}
  _, written, restored = _save_and_restore(tmp_path / 'large', large, caplog)
  assert written == {'w': (rows // 8, 256)}
  np.testing.assert_array_equal(restored['w'], large['w'])
