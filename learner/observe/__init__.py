"""What a run shows: metrics.jsonl, console, TensorBoard, status HTTP, run statistics, run outputs, and
`python -m learner report`."""
