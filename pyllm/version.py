"""pyllm's version, in a module of its own so that any module may import it without importing the package."""
__version__ = "0.1.0"  # as pyproject.toml says
