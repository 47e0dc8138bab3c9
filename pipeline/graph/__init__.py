"""The build graph: the project (specs, targets, layout) and the one table of stages."""
from .project import Project, load_project
from .stages import BACKENDS, BY_NAME, STAGES, Stage

__all__ = ["Project", "load_project", "STAGES", "BY_NAME", "Stage", "BACKENDS"]
