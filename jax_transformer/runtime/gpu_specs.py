"""What the GPU compiler needs to know of a GPU it cannot see: XLA's
``GpuTargetConfigProto`` as text, written from NVIDIA's published figures
for the H100 SXM and H200 (both Hopper, compute capability 9.0).
"""

from __future__ import annotations

# Figures that differ between the two (the rest is Hopper's).
_DEVICES = {
    'h100': dict(name='NVIDIA H100 80GB HBM3', memory=80 * 10 ** 9,
                 bandwidth=3_350_000_000_000),
    'h200': dict(name='NVIDIA H200', memory=141 * 10 ** 9,
                 bandwidth=4_800_000_000_000),
}

_HOPPER = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
device_description_str: "{name}"
"""


def target_config(chip: str) -> str:
  """The text proto of chip ('h100' or 'h200')."""
  return _HOPPER.format(**_DEVICES[chip])
