"""Lanner's performance suite: Kestrel's load tests and darner's benchmarks as one operator tool.

Run `python -m lanner.perf --help` (or `lanner-perf --help`).  Scenarios drive load from a small C
client (`loadgen.c`, built on first use) so the client is not the bottleneck on a 2-core box, and
report client and server CPU per op side by side.  See perf/README.md.
"""
