"""`python -m benchmarks paper`: DistRL's three claims in one resumable experiment (benchmark.py), its cells
(plan.py), greedy evaluation (eval.py) and summary (summary.py, markdown.py)."""
