# SPDX-License-Identifier: GPL-3.0-or-later
"""The generated part of each role's README (roles/<role>/README.md): its variables, from the
role's meta/argument_specs.yml (each entry point's options: name, type, default, description) with
the default the role really uses from defaults/main.yml, and the tags of its tasks.

    python -m tests.role_readmes           rewrite that part of every README (after an argument spec changed)
    python -m tests.role_readmes --check   list the READMEs whose part differs; exit status 1 if any

The part lies between the two marker lines below; the rest of a README (what the role does, the
example) is written by hand and kept as it is. A README without the markers gets the part at its
end, or before its "## Example". tests/unit/test_role_readmes.py keeps every README equal to what this renders.

A list, not a table: defaults are Jinja expressions whose filters are pipes, which GitHub's tables
split on unless escaped and Python-Markdown's (Galaxy's) show escaped.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parents[1] / "roles"
BEGIN = (
    "<!-- BEGIN variables and tags: generated from meta/argument_specs.yml, defaults/main.yml and tasks/"
    " by `python -m tests.role_readmes`; edit those, not this part -->"
)
END = "<!-- END variables and tags -->"
_MARKUP = re.compile(r"\b(HORIZONTALLINE|RV|[CIBMUOVLPE])\(")
_NO_TAGS = {"always", "never"}


def _close(text, start):
    """The index of the parenthesis closing the one before ``start`` (nested ones balanced)."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _code(text):
    """``text`` as one Markdown code span (longer fences when it holds backticks)."""
    text = " ".join(str(text).split())
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return "%s%s%s%s%s" % (ticks, pad, text, pad, ticks)


def markdown(text):
    """Ansible's documentation markup (C(), O(), M(), P(), L(), ...) as Markdown, on one line."""
    if isinstance(text, list):
        text = " ".join(str(t) for t in text)
    text = " ".join(str(text or "").split())
    out, pos = [], 0
    for match in _MARKUP.finditer(text):
        if match.start() < pos:
            continue
        end = _close(text, match.end())
        if end < 0:
            break
        kind, inner = match.group(1), text[match.end() : end]
        out.append(text[pos : match.start()])
        if kind in ("I",):
            out.append("*%s*" % inner)
        elif kind == "B":
            out.append("**%s**" % inner)
        elif kind == "U":
            out.append("<%s>" % inner)
        elif kind == "L":
            label, _, url = inner.rpartition(",")
            out.append("[%s](%s)" % (label.strip(), url.strip()))
        elif kind == "P" or "#" in inner and kind in ("M", "O", "RV"):
            # P(fqcn#type), O(fqcn#type:option): the option of that plugin
            fqcn, _, rest = inner.partition("#")
            option = rest.partition(":")[2]
            out.append("%s of %s" % (_code(option), _code(fqcn)) if option else _code(fqcn))
        elif kind == "HORIZONTALLINE":
            out.append(" ")
        else:  # C, O, V, RV, E, M: code
            out.append(_code(inner))
        pos = end + 1
    out.append(text[pos:])
    return "".join(out).strip()


def _value(value):
    """A default as YAML would write it, on one line, as code."""
    if isinstance(value, str):
        return _code(value) if value else '`""`'
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`%s`" % str(value).lower()
    if isinstance(value, (int, float)):
        return "`%s`" % value
    return _code(yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip())


def _load(path):
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def _tags(node, found):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "tags":
                found.update([value] if isinstance(value, str) else [str(t) for t in value or ()])
            else:
                _tags(value, found)
    elif isinstance(node, list):
        for item in node:
            _tags(item, found)
    return found


def role_tags(role_dir):
    """Every tag of the role's task files, sorted (``always`` and ``never`` left out)."""
    found = set()
    for path in sorted((role_dir / "tasks").glob("*.y*ml")):
        _tags(_load(path) if path.stat().st_size else [], found)
    return sorted(found - _NO_TAGS)


def _option_lines(name, option, defaults, indent=""):
    kind = option.get("type", "str")
    if option.get("elements"):
        kind = "%s of %s" % (kind, option["elements"])
    facts = [kind]
    if option.get("required"):
        facts.append("required")
    elif name in defaults:
        facts.append("default %s" % _value(defaults[name]))
    elif "default" in option:
        facts.append("default %s" % _value(option["default"]))
    if option.get("no_log"):
        facts.append("secret")
    text = markdown(option.get("description"))
    choices = option.get("choices")
    if choices:
        text += " One of %s." % ", ".join(_value(c) for c in choices)
    lines = ["%s- `%s` (%s): %s" % (indent, name, ", ".join(facts), text)]
    for sub_name, sub in (option.get("options") or option.get("suboptions") or {}).items():
        lines += _option_lines(sub_name, sub or {}, {}, indent + "  ")
    return lines


def render(role_dir):
    """The generated part of ``role_dir``'s README, markers included."""
    role_dir = Path(role_dir)
    specs = (_load(role_dir / "meta" / "argument_specs.yml").get("argument_specs")) or {}
    defaults = _load(role_dir / "defaults" / "main.yml")
    lines = [BEGIN, "", "## Variables", ""]
    if not specs:
        lines += ["The role has no argument spec.", ""]
    for entry in sorted(specs, key=lambda e: (e != "main", e)):
        spec = specs[entry] or {}
        if list(specs) != ["main"]:
            if entry == "main":
                how = " (the role itself)"
            elif list((role_dir / "tasks").glob(entry + ".y*ml")):
                how = " (`tasks_from: %s`)" % entry
            else:
                how = ""  # documentation only (a role without tasks)
            lines += ["### Entry point `%s`%s" % (entry, how), ""]
            if spec.get("short_description"):
                lines += [markdown(spec["short_description"]) + ".", ""]
        options = spec.get("options") or {}
        if entry != "main" and options and options == (specs.get("main") or {}).get("options"):
            lines += ["The variables of the entry point `main`.", ""]
            continue
        if not options:
            lines += ["No variables.", ""]
        for name in sorted(options):
            # every entry point runs with defaults/main.yml (tasks_from keeps defaults_from: main)
            lines += _option_lines(name, options[name] or {}, defaults)
        lines.append("")
    if (role_dir / "tasks").is_dir():
        tags = role_tags(role_dir)
        lines += ["## Tags", "", ", ".join("`%s`" % t for t in tags) if tags else "The tasks have no tags.", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def updated(readme_text, part):
    """``readme_text`` with its generated part replaced by ``part`` (appended when it has none)."""
    start, end = readme_text.find(BEGIN), readme_text.find(END)
    if start >= 0 and end > start:
        after = readme_text[end + len(END) :]
        return readme_text[:start] + part + (after[1:] if after.startswith("\n") else after)
    example = readme_text.find("\n## Example")
    if example >= 0:
        return readme_text[: example + 1] + part + "\n" + readme_text[example + 1 :]
    return readme_text.rstrip("\n") + "\n\n" + part


def roles():
    return sorted(p for p in ROLES.iterdir() if p.is_dir() and (p / "meta").is_dir())


def main(argv):
    check = "--check" in argv
    stale = []
    for role_dir in roles():
        readme = role_dir / "README.md"
        text = readme.read_text(encoding="utf-8") if readme.is_file() else "# gpufleet.node.%s\n" % role_dir.name
        new = updated(text, render(role_dir))
        if new != text:
            stale.append(str(readme.relative_to(ROLES.parent)))
            if not check:
                readme.write_text(new, encoding="utf-8")
    if stale:
        print(json.dumps({"stale" if check else "written": stale}, indent=1))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
