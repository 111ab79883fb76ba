"""glmdeploy: the Python side of the ChatGLM3-6B-32k deployment kit."""

__version__ = "0.1.0"
