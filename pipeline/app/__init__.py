"""The app-side runtime helper: `Runner` picks the artifact this machine can run, and runs it."""
from .runner import Choice, Runner

__all__ = ["Choice", "Runner"]
