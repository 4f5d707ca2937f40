"""A-RIDE's components, one removed at a time, at equal wall time: is each one worth having here?

The same runs and greedy evaluation as benchmarks/final_success.py (read its docstring), in async mode,
for: `aride` (everything on), `uniform` (uniform instead of prioritized replay sampling, `--replay
uniform`), `no_correction` (every importance ratio set to 1, so stale data counts as on-policy:
`--no-off-policy-correction`), `no_entropy` (no entropy bonus and no entropy term in the priority:
`--entropy-coef 0 --priority-weights 1 0.5 0`). The JSON's top level has each variant's mean and range
of greedy test success over the seeds, and `aride_over_<variant>`, A-RIDE's relative improvement.
"""

from __future__ import annotations

from benchmarks.final_success import compare


def run(quick: bool) -> tuple[list[dict], dict]:
    return compare(("aride", "uniform", "no_correction", "no_entropy"), quick)
