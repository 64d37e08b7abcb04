"""``rlkube bench NAME [options]``: dispatch to a benchmark's ``main(argv) -> int``.

To add a benchmark, add a line to :data:`BENCHMARKS` (module path of a ``main(argv)``); modules
are imported only when chosen, so one benchmark's optional peers never slow another down.
"""

from __future__ import annotations

import importlib
import sys

#: name -> (module with ``main(argv) -> int``, one-line description)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "weights": ("benchmarks.weights.run", "weight sync train -> eval: rlkube vs Ray, gloo, raw gRPC, memcpy"),
    "transport": (
        "benchmarks.weights.transport",
        "the weight fetch alone vs a raw gRPC stream, discarding and copying its bytes",
    ),
    "sharded": (
        "benchmarks.weights.sharded_netns",
        "Sharded weight fetch from 2 train ranks on namespaced nodes vs one stream (root; tc links)",
    ),
    "auth": (
        "benchmarks.auth.run",
        "cost of the per-job credential on the weight stream and the trajectory push",
    ),
    "rollout": (
        "benchmarks.rollout.run",
        "env steps/s for 1, 2, 4 eval workers, sync vs async, batched vs per-env requests, vs Ray",
    ),
    "intake": (
        "benchmarks.rollout.intake",
        "the trajectory plane's ceiling: synthetic fragments flood rank 0 (no env, no learner)",
    ),
    "fragment-bytes": (
        "benchmarks.rollout.fragment_bytes",
        "one trajectory fragment's size on the wire, as sent and with uint8 leaves as float32",
    ),
    "learn": (
        "benchmarks.learn.run",
        "learning curves of a reference job over seeds: rlkube's PPO vs SB3's, CleanRL's figure beside",
    ),
    "ablation": (
        "benchmarks.learn.ablation",
        "the built-in PPO's switches on and off against SB3's PPO, seeds x arms as parallel processes",
    ),
    "stale": (
        "benchmarks.learn.stale",
        "async with stale fragments dropped vs corrected by V-trace, against the sync engine (CartPole)",
    ),
}


def usage() -> str:
    lines = ["usage: rlkube bench NAME [options]   (NAME --help for its options)", "", "benchmarks:"]
    lines += [f"  {name:10s} {description}" for name, (_, description) in sorted(BENCHMARKS.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in BENCHMARKS:
        print(f"rlkube bench: unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
