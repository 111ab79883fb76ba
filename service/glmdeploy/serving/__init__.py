"""What runs on a serving node beside vLLM: readiness, the process guard, the engine's sizing, the
fingerprint, the node's facts.
"""
