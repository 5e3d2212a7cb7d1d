"""The agent's version (pyproject.toml's), which its endpoint and metrics report."""

__version__ = "0.1.0"
