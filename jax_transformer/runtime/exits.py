"""The exit statuses a run ends with, for restart loops and schedulers.

0: finished. 1: a failure (a bug, or a fault the run cannot judge).
2 (``cli.EXIT_USAGE``): refused in one sentence (bad configuration or
input; rerunning unchanged fails again). 69 (EX_UNAVAILABLE): stopped
because another process of the run was lost; rerun to resume. 75
(EX_TEMPFAIL): stopped by SIGTERM or SIGINT after saving; rerun to resume.
124 (timeout(1)'s): stopped itself because nothing progressed (a stuck
collective or reader); rerun to resume.
"""

EXIT_LOST_PROCESS = 69
EXIT_INTERRUPTED = 75
EXIT_STUCK = 124
