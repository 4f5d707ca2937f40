"""`python -m benchmarks chaos`: the soak (soak.py), its fault proxy (proxy.py) and the audit of its
invariants (audit.py)."""
