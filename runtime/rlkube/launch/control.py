"""``rlkube scale RUN_DIR --evaluators K``: change the eval worker count of a running local job.

I/O: writes ``control.json`` in the run directory; the local supervisor reads it every tick and
starts or drains eval workers, as ``kubectl scale rlj/NAME --replicas=K`` does in a cluster.
"""

from __future__ import annotations

import argparse
import sys

from rlkube.launch.local import CONTROL_FILE, write_control


def scale(args: argparse.Namespace) -> int:
    if args.evaluators < 0:
        print(f"rlkube scale: --evaluators must be >= 0, got {args.evaluators}", file=sys.stderr)
        return 2
    if not (args.run_dir / CONTROL_FILE).is_file():
        print(
            f"rlkube scale: {args.run_dir} is not a running local job (no {CONTROL_FILE}); "
            "give the run directory `rlkube run` printed",
            file=sys.stderr,
        )
        return 2
    write_control(args.run_dir, args.evaluators)
    print(f"{args.run_dir}: eval workers -> {args.evaluators}")
    return 0
