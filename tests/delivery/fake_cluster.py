"""Stand-ins for docker, kind, kubectl and helm, so e2e/run.sh's own logic runs here without a cluster.

Usage (from a wrapper named after the tool): ``python fake_cluster.py TOOL ARGS...``. Every call is
appended to $FAKE_LOG as one line. $FAKE_SCENARIO picks a fault to inject:

- ``ok``: a healthy run;
- ``train-restarted``: a train pod's restart count rises while eval workers are scaled;
- ``missing-column``: ``kubectl get rlj`` has no RETURN column;
- ``finished-early``: the job is already Complete when the script wants to scale it;
- ``children-left``: the deleted job's StatefulSet is never garbage-collected.

Canned answers only: this checks the script's checks, not Kubernetes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def kubectl(args: list[str], scenario: str, state: Path) -> str:
    joined = " ".join(args)
    if "get pods" in joined and "rlkube.io/role=train" in joined:
        calls = int(state.read_text()) if state.exists() else 0
        state.write_text(str(calls + 1))
        restarts = 1 if scenario == "train-restarted" and calls > 0 else 0
        return f"cartpole-kind-train-0 uid-0 {restarts}\ncartpole-kind-train-1 uid-1 0\n"
    if "jsonpath={.metadata.generation}" in joined:
        return "1"
    if "statefulset/cartpole-kind-train -o jsonpath={.spec.replicas}" in joined:
        return "2"
    if "jsonpath={.spec.evaluator.replicas}" in joined:
        return "3"
    if '@.type=="Complete"' in joined:
        return "True" if scenario == "finished-early" else "False"
    if '@.type=="Failed"' in joined:
        return ""
    if "jsonpath={.status.phase}" in joined:
        return "Complete"
    if args[-2:] == ["rlj", "cartpole-kind"]:
        columns = "NAME PHASE TRAIN EVAL EPOCH PUBLISHED LOADED RETURN AGE"
        if scenario == "missing-column":
            columns = columns.replace(" RETURN", "")
        return f"{columns}\ncartpole-kind Running 2/2 3/3 7 7 7 180.5 2m\n"
    if "--ignore-not-found" in args and "-o" in args and "name" in args:
        return "statefulset.apps/cartpole-kind-train\n" if scenario == "children-left" else ""
    return ""


def main() -> int:
    tool, *args = sys.argv[1:]
    log = Path(os.environ["FAKE_LOG"])
    with log.open("a") as out:
        out.write(f"{tool} {' '.join(args)}\n")
    scenario = os.environ.get("FAKE_SCENARIO", "ok")
    if tool == "kubectl":
        sys.stdout.write(kubectl(args, scenario, log.with_suffix(".train-calls")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
