"""`python -m benchmarks paper`: DistRL's three claims in one resumable experiment (benchmark.py), its cells
and sizes (plan.py), greedy evaluation (eval.py), summary (summary.py, markdown.py), the verdict rules
fixed before the standard run (verdict.py), its time estimate (progress.py), the results file
(results.py) and its figures (figure.py)."""
