"""`python -m benchmarks NAME [--quick | --standard] [--json PATH]`: run a benchmark, print a table, write
JSON."""

from __future__ import annotations

import argparse
import importlib
import inspect
import shlex

from benchmarks.report import emit

BENCHMARKS = {
    "wire": "benchmarks.wire",
    "checkpoint": "benchmarks.checkpoint",
    "chaos": "benchmarks.chaos.benchmark",
    "learner_step": "benchmarks.learner_step",
    "simphone": "benchmarks.simphone",
    "train_scaling": "benchmarks.train_scaling",
    "broadcast": "benchmarks.broadcast",
    "ingest": "benchmarks.ingest",
    "adb_step": "benchmarks.adb_step",
    "collection": "benchmarks.collection",
    "paper": "benchmarks.paper.benchmark",
    "actor_loss": "benchmarks.actor_loss",
    "text_encoder": "benchmarks.text_encoder",
    "decoder_speed": "benchmarks.decoder_speed",
    "ray_launch": "benchmarks.ray_launch",
    "lm_agent": "benchmarks.lm_agent",
    "inference": "benchmarks.inference",
    "generalization": "benchmarks.generalization",
    "generalization_final": "benchmarks.generalization_final",
    "stopping": "benchmarks.stopping",
    "lm_act": "benchmarks.lm_act",
    "lm_prompt": "benchmarks.lm_prompt",
    "gpu": "benchmarks.gpu",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name", choices=[*BENCHMARKS, "all"], help="which benchmark to run")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and smaller sizes")
    parser.add_argument(
        "--standard",
        action="store_true",
        help="the size between --quick and the full one, for the benchmarks that take it (paper)",
    )
    parser.add_argument("--json", help="write the results here (with 'all': a prefix, NAME.json appended)")
    parser.add_argument(
        "--learner-args",
        default="",
        help="extra learner flags for the benchmarks that run the learner and take them, "
        "e.g. --learner-args='--max-policy-lag 50'",
    )
    parser.add_argument("--minutes", type=float, help="how long, for the benchmarks that take it (chaos)")
    parser.add_argument("--seed", type=int, help="the seed, for the benchmarks that take it (chaos)")
    parser.add_argument(
        "--processes", type=int, help="learner processes, for the benchmarks that take it (chaos: 1 or 2)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="every part at tiny sizes on CPU, for the benchmarks that take it (gpu)",
    )
    args = parser.parse_args()
    names = list(BENCHMARKS) if args.name == "all" else [args.name]
    extra = tuple(shlex.split(args.learner_args))
    for name in names:
        run = importlib.import_module(BENCHMARKS[name]).run
        takes = inspect.signature(run).parameters
        if extra and "extra" not in takes:
            parser.error(f"{name} takes no --learner-args")
        kwargs = {"extra": extra} if "extra" in takes else {}
        for option in ("minutes", "seed", "processes", "dry_run", "standard"):
            if getattr(args, option) not in (None, False):
                if option not in takes:
                    parser.error(f"{name} takes no --{option.replace('_', '-')}")
                kwargs[option] = getattr(args, option)
        rows = run(args.quick, **kwargs)
        rows, summary = rows if isinstance(rows, tuple) else (rows, None)  # (rows, summary over them)
        path = args.json if len(names) == 1 else (f"{args.json}{name}.json" if args.json else None)
        emit(name, rows, path, summary)


if __name__ == "__main__":
    main()
