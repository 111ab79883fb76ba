"""ChatGLM3's prompt format and tokenizer: the prompt builder, the conversation window, the
tokenizer vLLM serves, the golden files.
"""
