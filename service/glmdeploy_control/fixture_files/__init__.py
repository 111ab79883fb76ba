"""Sources the fixture model ships in its directory.

Copied there by `glmdeploy_control.fixture`, never imported by the kit.

They are the kit's own code written to the contract of ChatGLM3-6B-32k's remote code: the
model directory is loaded with `trust_remote_code=True`, as the real one must be.
"""
