"""Benchmark any OpenAI-compatible endpoint the way users load it: streamed requests over HTTP.

Why the kit has its own: the figures people quote (tok/s, P99) only mean
something with the exact workload, versions and hardware next to them, and the
node's throughput smoke test compares against a baseline recorded the same way.
Prompts are random token ids from a fixed seed and every request produces
exactly its output length (eos and stop ids ignored), so two runs compare.

    python -m glmdeploy.tools.bench run --node-config /etc/glmdeploy/node.json \
        --input-lens 512,2048 --output-lens 128 --concurrency 1,4,16 --json out.json --plots out/
    python -m glmdeploy.tools.bench baseline --node-config /etc/glmdeploy/node.json --out baseline.json

client: the requests and their latencies; sweep: request-rate sweeps; report: plots and tables;
cli: the command line.
"""
