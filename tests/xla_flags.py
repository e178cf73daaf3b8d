"""XLA_FLAGS for the test session and the CPU processes it starts.

LLVM compiles the tests' CPU programs at -O0. The tests' programs are tiny
and most run a few times, so code generation is most of their cost: at -O0
one test file's CPU time (tests/train/test_grad_accumulation.py) falls from
69 s to 37 s, and a cold-cache 2-step train.py run's from 20-24 s to 15-16 s.
Results may differ in the last bits (the order and contraction of
floating-point operations): the tiny LM's parameters after three steps
differ from -O2's by at most 1.2e-7, far inside every tolerance, and a
comparison that must be bitwise (a resume, a restore) runs both sides
here. The README's jobs run as users run them, at XLA's default level
(tests/scripts/test_readme_jobs.py drops these flags).
"""

QUICK_CODEGEN = '--xla_backend_optimization_level=0'


def cpu(devices: int) -> str:
  """XLA_FLAGS for a CPU process with `devices` host devices."""
  return f'--xla_force_host_platform_device_count={devices} {QUICK_CODEGEN}'
