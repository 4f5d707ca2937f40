"""`python -m learner`: train from actors over ZeroMQ. Subcommands: `eval` evaluates a checkpoint, `keys`
writes CURVE key pairs, `report` plots and summarizes runs from their metrics.jsonl, `launch` places the
learner and its actors on a running Ray cluster, `generate` continues a prompt with a pretrained decoder,
`export` writes a decoder as a Hugging Face folder (each has --help)."""

from __future__ import annotations

import os
import sys

import tyro

from learner.config import parse_args


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "eval":
        from learner.tools.evaluate import EvalConfig, evaluate

        evaluate(tyro.cli(EvalConfig, args=sys.argv[2:], prog="python -m learner eval"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "keys":
        from common.net.curve import KeysConfig, write_keys

        write_keys(tyro.cli(KeysConfig, args=sys.argv[2:], prog="python -m learner keys"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        from learner.observe.report import ReportConfig, report

        report(tyro.cli(ReportConfig, args=sys.argv[2:], prog="python -m learner report"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "launch":
        from learner.launch.cluster import launch
        from learner.launch.config import LaunchConfig

        sys.exit(launch(tyro.cli(LaunchConfig, args=sys.argv[2:], prog="python -m learner launch")))
    if len(sys.argv) > 1 and sys.argv[1] == "generate":
        from learner.tools.generate import GenerateConfig
        from learner.tools.generate import main as generate

        sys.exit(generate(tyro.cli(GenerateConfig, args=sys.argv[2:], prog="python -m learner generate")))
    if len(sys.argv) > 1 and sys.argv[1] == "export":
        from learner.tools.export import ExportConfig
        from learner.tools.export import main as export

        sys.exit(export(tyro.cli(ExportConfig, args=sys.argv[2:], prog="python -m learner export")))
    from learner.loop import run

    last = run(parse_args())
    if last.get("abandoned"):
        # A compile or update still runs on a daemon thread inside XLA: end the process now, as the signal
        # asked, rather than finalize the interpreter under it (XLA aborts; everything is saved and closed).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
