"""XLA_FLAGS for the test session and the CPU processes it starts.

The tests' CPU programs are tiny and most run a few times, so compiling
them is most of their cost. Three flags make it cheap:
- LLVM at -O0: one test file's CPU time (tests/train/test_grad_accumulation.py)
  fell from 69 s to 37 s, a cold-cache 2-step train.py run's from 20-24 s
  to 15-16 s;
- XLA's elemental emitters instead of its MLIR fusion emitters, and
- one LLVM module per program instead of 32 split for parallel codegen:
  with these two, a tiny LM train step compiles in 0.37 CPU-s instead of
  1.72 s at -O0 alone, and two of the heaviest in-process test files
  (decoding/test_generate_and_beam_search.py, model/test_models.py) run in
  63 s instead of 132 s on two workers.
Results may differ in the last bits (the order and contraction of
floating-point operations): lm_shakespeare:tiny's model (a 96-token
vocabulary; on one host device or eight alike) gives logits (up to 0.5)
1.5e-7 from XLA's
defaults', and parameters (up to 1.0) after three AdamW steps 6.7e-8
from them (and bit for bit those of -O0 alone), far inside every
tolerance; tests/interop/test_parity_at_default_flags.py measures both
in two processes and holds them within twice those figures, and compares
each family with its reference at the defaults too. A comparison that
must be bitwise (a resume, a restore) runs both sides here. The README's
jobs run as users run them, at XLA's defaults
(tests/scripts/test_readme_jobs.py drops these flags).
"""

QUICK_CODEGEN = ('--xla_backend_optimization_level=0'
                 ' --xla_cpu_use_fusion_emitters=false'
                 ' --xla_cpu_parallel_codegen_split_count=1')


def cpu(devices: int) -> str:
  """XLA_FLAGS for a CPU process with `devices` host devices."""
  return f'--xla_force_host_platform_device_count={devices} {QUICK_CODEGEN}'
