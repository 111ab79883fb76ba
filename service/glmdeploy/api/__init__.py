"""Talking to a node's OpenAI-compatible server: the HTTP client and its stream parser (every part
uses them).
"""
