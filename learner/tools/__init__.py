"""`python -m learner export | generate | eval`."""
