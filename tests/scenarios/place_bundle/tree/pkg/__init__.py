"""The scenario package."""
