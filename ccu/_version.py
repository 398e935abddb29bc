"""The library's version (also in ``pyproject.toml``): results record it, the book prints it."""

__version__ = "0.9.0"
