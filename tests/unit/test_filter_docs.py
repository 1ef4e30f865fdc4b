# SPDX-License-Identifier: GPL-3.0-or-later
"""Every filter a FilterModule of plugins/filter/ exports has its documentation beside it, in
plugins/filter/<filter name>.yml (what ansible-doc -t filter and Galaxy's importer read), and that
documentation states the filter's real arguments: the piped value is ``_input``, every other
option is a parameter of the function (or, for ``**kwargs`` passed on, of the function it calls),
required exactly where the parameter has no default, with the function's default, and
``positional`` names the parameters in their order. (tests/integration/test_galaxy_import.py
renders them all through ansible-doc.)"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import yaml

FILTER_DIR = Path(__file__).resolve().parents[2] / "plugins" / "filter"
PACKAGE = "ansible_collections.gpufleet.node.plugins.filter"
# Filters whose **kwargs are keyword arguments of the function they call, by that function's name;
# other **kwargs (file_entries' fixed keys) are free-form and documented in the description.
KWARGS_GO_TO = {"vllm_serve_config": "serve_config"}


def _exported():
    out = {}
    for path in sorted(FILTER_DIR.glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module("%s.%s" % (PACKAGE, path.stem))
        for name, func in module.FilterModule().filters().items():
            assert name not in out, "%s is exported by %s and %s" % (name, out.get(name, (None, "?"))[1], path.name)
            out[name] = (func, path.name, module)
    return out


FILTERS = _exported()


def _callee(module, name):
    """The function ``name`` in a module the filter's module imports (whatever its alias)."""
    found = [getattr(v, name) for v in vars(module).values() if inspect.ismodule(v) and hasattr(v, name)]
    assert len(found) == 1, "no single module imported by %s has %s" % (module.__name__, name)
    return found[0]


def _doc(name):
    path = FILTER_DIR / ("%s.yml" % name)
    assert path.is_file(), "filter %s has no documentation: add %s" % (name, path.relative_to(FILTER_DIR.parents[1]))
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_the_filters_are_the_ones_documented():
    """No documentation without a filter (a renamed filter leaves none behind)."""
    documented = {p.stem for p in FILTER_DIR.glob("*.yml")}
    assert documented == set(FILTERS)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_documentation_states_the_real_arguments(name):
    func, _file, module = FILTERS[name]
    data = _doc(name)
    assert set(data) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    doc = data["DOCUMENTATION"]
    assert doc["name"] == name
    assert doc["short_description"] and doc["description"] and doc["author"]
    assert set(data["RETURN"]) == {"_value"} and data["RETURN"]["_value"]["description"]
    assert "gpufleet.node.%s" % name in data["EXAMPLES"], "the examples call it by its FQCN"

    params = list(inspect.signature(func).parameters.values())
    named = [p for p in params[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    options = doc.get("options") or {}
    assert options["_input"]["required"] is True

    extra = set(options) - {"_input"} - {p.name for p in named}
    if name in KWARGS_GO_TO:
        callee = inspect.signature(_callee(module, KWARGS_GO_TO[name])).parameters
        unknown = extra - set(callee)
        assert not unknown, "%s documents options that %s does not take: %s" % (name, KWARGS_GO_TO[name], unknown)
        named += [callee[o] for o in sorted(extra)]
    else:
        assert not extra, "documented options that the filter does not take: %s" % sorted(extra)
    missing = {p.name for p in named} - set(options)
    assert not missing, "arguments of %s without documentation: %s" % (name, sorted(missing))

    for param in named:
        option = options[param.name]
        assert option["description"] and option["type"], param.name
        if param.default is inspect.Parameter.empty:
            assert option.get("required") is True, "%s is required" % param.name
            continue
        assert not option.get("required"), "%s has a default, it is not required" % param.name
        default = list(param.default) if isinstance(param.default, tuple) else param.default
        if default is None:
            assert option.get("default") is None, "%s: the function's default is None" % param.name
        else:
            assert option.get("default") == default, "%s: the function's default is %r" % (param.name, default)

    positional = [p.strip() for p in str(doc.get("positional", "_input")).split(",")]
    order = ["_input"] + [p.name for p in params[1:] if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == order[: len(positional)], "positional must follow the parameters' order %s" % order
