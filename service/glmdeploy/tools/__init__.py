"""Client tools run against a node: the benchmark, the load generator, the soak, the output
recorder, the terminal chat.
"""
