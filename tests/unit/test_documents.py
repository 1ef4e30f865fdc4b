# SPDX-License-Identifier: GPL-3.0-or-later
"""The repository's documents say what a thing is, never which ticket or session brought it: no
issue numbers of this project, no "this round", no nicknames of the field reports the project was
started from ("seed 000"). Upstream references stay (``NVIDIA/nccl issue 700``, a GitHub URL).

The words are read from every tracked text file (code comments and docstrings are documents too),
so a new file cannot slip past a list kept by hand."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.harness import REPO

#: Where an issue number is someone else's: a repository or tracker named shortly before it
#: (``NVIDIA/nccl issue 700``, ``vllm-project/vllm PR 10511 and issue 11550``, ``nccl-tests issue
#: 272``, a github.com URL).
UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+|nccl-tests|github\.com", re.I)
UPSTREAM_REACH = 60  # characters before the number that may name the tracker


FORBIDDEN = (
    (re.compile(r"\bissues? #?(\d+)\b", re.I), "an issue number"),
    (re.compile(r"\b(this|last|next) round\b", re.I), "a reference to a round of work"),
    (re.compile(r"\bseeds? \d{3}\b", re.I), "a field report's nickname"),
)

THIS_FILE = "tests/unit/test_documents.py"
TEXT_SUFFIXES = {".py", ".yml", ".yaml", ".md", ".j2", ".sh", ".cfg", ".ini", ".txt", ".toml", ".json"}


def _tracked_text_files():
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in names:
        path = REPO / name
        if name == THIS_FILE or name.startswith("tests/data/"):
            continue  # this file's examples; captured samples are quoted as they were found
        if path.suffix in TEXT_SUFFIXES and path.is_file():
            yield name, path


def findings(text):
    """(line number, what) for each forbidden phrase in ``text``; an issue number is forbidden
    unless the words just before it name another project's tracker."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in FORBIDDEN:
            for match in pattern.finditer(line):
                if what == "an issue number" and UPSTREAM.search(
                    line[max(0, match.start() - UPSTREAM_REACH) : match.start()]
                ):
                    continue
                found.append((number, "%s (%r)" % (what, match.group(0))))
    return found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("# numbers nobody measured (issue 12)", 1),
        ("Issue 17 / seed 000: KV usage", 2),
        ("timings of this round", 1),
        ("redirect roughly halves bus bandwidth (NVIDIA/nccl issue 700)", 0),
        ("(nccl-tests issue 272: 475 on 8x H200)", 0),
        ("vLLM's `/health` answers 200 while hung (vllm-project/vllm#39863)", 0),
        ("github.com/NVIDIA/open-gpu-kernel-modules issue 1150", 0),
        ("vllm-project/vllm PR 10511 and issue 11550", 0),
    ],
)
def test_the_rule_tells_our_tickets_from_upstream_references(text, expected):
    assert len(findings(text)) == expected, findings(text)


def test_no_document_names_a_ticket_a_round_or_a_field_report_nickname():
    problems = []
    for name, path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        problems += ["%s:%d: %s" % (name, number, what) for number, what in findings(text)]
    assert not problems, "say what the thing is instead:\n" + "\n".join(problems)
