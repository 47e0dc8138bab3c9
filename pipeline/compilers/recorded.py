"""Facts about a compiler recorded per tool version in a JSON table beside the code, so that
loading the project looks them up instead of running or importing the compiler.

Table layout: {"format": 1, "versions": {tool version: entry}}. `refresh` asks the installed
tool again and rewrites its version's entry (other versions are kept); a unit test compares the
recorded entry with the live answer, so a stale table shows up in CI.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..core.store import pretty_json
from ..core.tools import distribution_version

FORMAT = 1


@dataclass
class RecordedTable:
    path: Path
    distribution: str                    # the Python distribution whose version keys the table
    ask: Callable[[], Any]               # the live answer of the installed tool (slow)
    _versions: dict | None = field(default=None, repr=False)

    def versions(self) -> dict:
        if self._versions is None:
            self._versions = json.loads(self.path.read_text())["versions"]
        return self._versions

    def entry(self, version: str):
        """The recorded entry for a tool version, or None when the table has none."""
        return self.versions().get(version)

    def installed_version(self) -> str:
        return distribution_version(self.distribution)

    def refresh(self) -> str:
        table = (json.loads(self.path.read_text()) if self.path.is_file()
                 else {"format": FORMAT, "versions": {}})
        version = self.installed_version()
        table["versions"][version] = self.ask()
        self.path.write_text(pretty_json(table))
        self._versions = None
        return version

    def main(self, argv, description: str, summary: Callable[[str], str]) -> int:
        """`python -m <module> --refresh`: ask the installed tool, rewrite the table."""
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--refresh", action="store_true",
                            help=f"ask the installed {self.distribution} and rewrite the table")
        if not parser.parse_args(argv).refresh:
            parser.print_help()
            return 2
        version = self.refresh()
        print(f"{self.path}: {self.distribution} {version}: {summary(version)}")
        return 0
