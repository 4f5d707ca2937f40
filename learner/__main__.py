"""`python -m learner`: train from actors over ZeroMQ. `--help` lists every option."""

from __future__ import annotations

import tyro

from learner.config import LearnerConfig
from learner.loop import run


def main() -> None:
    cfg = tyro.cli(LearnerConfig)
    run(cfg)


if __name__ == "__main__":
    main()
