"""`python -m actors --host HOST`: run phone environments and stream episodes to a learner.

`python -m actors demos ...` writes oracle demonstrations on SimPhone tasks instead (see --help);
`python -m actors relay --host HOST` forwards the learner's parameter snapshots to this host's actors;
`python -m actors doctor` checks an adb server and its devices before `--backend adb`;
`python -m actors eval` runs the greedy episodes of `python -m learner eval`.
"""

from __future__ import annotations

import functools
import sys

import tyro


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "check-args":  # hidden: the learner's check of actor flags
        from actors.tools.check_args import main as check_args

        sys.exit(check_args(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "demos":
        from actors.tools.demos import DemosConfig, write_demos

        write_demos(tyro.cli(DemosConfig, args=sys.argv[2:], prog="python -m actors demos"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "eval":  # run by `python -m learner eval`
        from actors.tools.evaluate import EvalRunConfig, run_eval

        run_eval(tyro.cli(EvalRunConfig, args=sys.argv[2:], prog="python -m actors eval"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "doctor":
        from actors.tools.doctor import DoctorConfig, run_doctor

        sys.exit(run_doctor(tyro.cli(DoctorConfig, args=sys.argv[2:], prog="python -m actors doctor")))
    if len(sys.argv) > 1 and sys.argv[1] == "relay":
        from actors.tools.relay import RelayConfig, run_relay

        run_relay(tyro.cli(RelayConfig, args=sys.argv[2:], prog="python -m actors relay"))
        return
    from actors.actor import Actor, install_signal_handlers
    from actors.config import ActorConfig

    cfg = tyro.cli(
        ActorConfig,
        description="Run phone environments and stream episodes to a learner. "
        "Subcommands: `python -m actors demos --help` writes oracle demonstrations; "
        "`python -m actors relay --help` shares one copy of each snapshot among a host's actors; "
        "`python -m actors doctor --help` checks phones and emulators for --backend adb.",
    )
    actor = Actor(cfg, log=functools.partial(print, flush=True))
    install_signal_handlers(actor)
    actor.run()


if __name__ == "__main__":
    main()
