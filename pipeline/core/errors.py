"""The one exception type the pipeline raises on purpose."""
from __future__ import annotations


class PipelineError(Exception):
    """A problem the user can act on: says where, what, why, and what to do next.

    Real bugs (TypeError and friends) are not wrapped: they surface as tracebacks.
    """

    def __init__(self, what: str, *, stage: str | None = None, model: str | None = None,
                 target: str | None = None, hint: str | None = None, log: str | None = None):
        self.what, self.stage, self.model, self.target = what, stage, model, target
        self.hint, self.log = hint, log
        super().__init__(self.render())

    def where(self) -> str:
        parts = [f"{k}={v}" for k, v in (("model", self.model), ("target", self.target),
                                          ("stage", self.stage)) if v]
        return " ".join(parts)

    def render(self) -> str:
        text = f"[{self.where()}] {self.what}" if self.where() else self.what
        if self.log:
            text += f"\n  log: {self.log}"
        if self.hint:
            text += f"\n  next: {self.hint}"
        return text


class SpecError(PipelineError):
    """Every problem found in models/*/model.yaml and the target registry, reported at once."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        body = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in the specs, nothing was built:\n{body}",
                         stage="spec")


def unknown_keys(problems: list, where: str, got, allowed) -> None:
    """Append one spec problem per key of `got` outside `allowed`, naming the allowed ones."""
    for key in sorted(set(got) - set(allowed)):
        problems.append(f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})")
