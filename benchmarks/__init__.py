"""Speed and memory targets, each run as `python -m benchmarks.<name>`; the last stdout line
is one JSON object comparing against a baseline measured in the same run."""
