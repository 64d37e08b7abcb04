"""``rlkube validate JOB.yaml``: every check that needs no cluster, and a word on what it did not check.

I/O: reads the job, imports its modules and the policy (so torch), prints. Exit codes: 0 valid,
2 refused (the reason and the field are printed). ``--schema-only`` stops after the spec (no torch).
"""

from __future__ import annotations

import argparse
import sys

from rlkube.jobfile import load_job
from rlkube.spec import SpecError

EXIT_OK = 0
EXIT_INVALID = 2

#: What only a cluster (or the pods) can tell.
NOT_CHECKED = (
    "the image, resources, node selectors and scheduling (the cluster decides)",
    "spec.checkpoint.path when it is not on this machine (it is read inside the pods' volume)",
)


def validate(args: argparse.Namespace) -> int:
    try:
        job = load_job(args.job, args.overrides)
    except SpecError as exc:
        print(f"rlkube: {exc}", file=sys.stderr)
        return EXIT_INVALID
    lines = ["spec: every field validates (the CRD schema and the cross-field rules)"]
    # Not refusals: the job is valid for a cluster (one rank per pod on its own GPUs).
    warnings: list[str] = []
    if not getattr(args, "schema_only", False):
        from rlkube.launch.preflight import checkpoint_file, local_gpus, preflight
        from rlkube.placement import TrainPlacement, placement_problems

        path = job.spec.checkpoint.path
        local_checkpoint = path is not None and checkpoint_file(path).exists()
        checks = preflight(job, check_checkpoint=local_checkpoint)
        if checks.refusal is not None:
            problems = "\n".join(f"  - {p}" for p in checks.refusal.problems)
            print(
                f"rlkube: invalid job {args.job} ({checks.refusal.reason.value}):\n{problems}",
                file=sys.stderr,
            )
            return EXIT_INVALID
        lines += checks.checked
        placement = TrainPlacement.local(job.spec, gpus=local_gpus())
        for problem in placement_problems(placement):
            warnings.append(f"rlkube run on this machine would refuse it: {problem}")
    not_checked = NOT_CHECKED if not getattr(args, "schema_only", False) else ("the policy, env and buffer",)
    print(f"{args.job}: valid RLJob {job.namespace}/{job.name}")
    print("checked:\n" + "\n".join(f"  - {line}" for line in lines))
    print("not checked without a cluster:\n" + "\n".join(f"  - {line}" for line in not_checked))
    if warnings:
        print("warning:\n" + "\n".join(f"  - {line}" for line in warnings))
    return EXIT_OK
