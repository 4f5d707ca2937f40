"""`python -m actors --host HOST`: run phone environments and stream episodes to a learner."""

from __future__ import annotations

import functools

import tyro

from actors.actor import Actor, install_signal_handlers
from actors.config import ActorConfig


def main() -> None:
    cfg = tyro.cli(ActorConfig)
    actor = Actor(cfg, log=functools.partial(print, flush=True))
    install_signal_handlers(actor)
    actor.run()


if __name__ == "__main__":
    main()
