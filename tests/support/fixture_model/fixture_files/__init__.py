"""Sources the fixture model ships in its directory.

Copied there by `fixture_model` (the package above), never imported by the kit. Their own
docstrings still name the generator by its old module path, `glmdeploy_control.fixture`: they
are copied into the model directory byte for byte, and editing them would change the fixture's
manifest.

They are the kit's own code written to the contract of ChatGLM3-6B-32k's remote code: the
model directory is loaded with `trust_remote_code=True`, as the real one must be.
"""
