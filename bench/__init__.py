"""Lamina load generator and benchmarks.

``lamina bench``: ``cli`` registers the command; ``workloads`` sets up and scores
each workload; ``workers`` is what runs in the client processes; ``loadgen`` starts those
processes together and merges their samples (HdrHistogram percentiles, timelines); ``spawn``
starts the server under test and reads its CPU and memory from /proc; ``report`` prints the
tables and draws the plot; ``profiler`` attaches py-spy to the server; ``peers/`` runs the
same workloads on other systems (``--against redis``) and ``compare`` shows them beside
Lamina's. ``micro/`` holds the engine's in-process micro-benchmarks (pytest-benchmark).
Results: ``RESULTS.md``.
"""
