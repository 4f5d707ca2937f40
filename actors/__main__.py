"""`python -m actors --host HOST`: run phone environments and stream episodes to a learner.

`python -m actors demos ...` writes oracle demonstrations on SimPhone tasks instead (see --help).
"""

from __future__ import annotations

import functools
import sys

import tyro

from actors.config import ActorConfig


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "demos":
        from actors.demos import DemosConfig, write_demos

        write_demos(tyro.cli(DemosConfig, args=sys.argv[2:], prog="python -m actors demos"))
        return
    from actors.actor import Actor, install_signal_handlers

    cfg = tyro.cli(
        ActorConfig,
        description="Run phone environments and stream episodes to a learner. "
        "Subcommand: `python -m actors demos --help` writes oracle demonstrations.",
    )
    actor = Actor(cfg, log=functools.partial(print, flush=True))
    install_signal_handlers(actor)
    actor.run()


if __name__ == "__main__":
    main()
