# SPDX-License-Identifier: GPL-3.0-or-later
"""Every role has a README (Galaxy's importer refuses a collection with a role without one) whose
variables and tags are what tests/role_readmes.py renders from the role's argument spec, defaults
and tasks (so they cannot drift from them: after a spec changes, run `python -m tests.role_readmes`),
and whose example is a play that calls the role by its FQCN with variables the role takes."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from tests import role_readmes

ROLES = role_readmes.roles()
NAMES = [r.name for r in ROLES]
# Names every role may be given: the private role's shared ones (its entry point `shared`).
SHARED = set(
    (yaml.safe_load((role_readmes.ROLES / "_common" / "meta" / "argument_specs.yml").read_text()) or {})
    .get("argument_specs", {})
    .get("shared", {})
    .get("options", {})
    if (role_readmes.ROLES / "_common").is_dir()
    else ()
)


def _spec(role_dir):
    return (yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text()) or {}).get("argument_specs") or {}


def test_every_role_is_found():
    assert {"pcie_p2p", "gpu_health", "nccl_gate", "vllm_server", "worker_recycle"} <= set(NAMES)


@pytest.mark.parametrize("role_dir", ROLES, ids=NAMES)
def test_readme_variables_and_tags_are_the_generated_ones(role_dir):
    readme = role_dir / "README.md"
    assert readme.is_file(), (
        "%s has no README.md (run `python -m tests.role_readmes`, then write its example)" % role_dir
    )
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# gpufleet.node.%s" % role_dir.name)
    assert text.count(role_readmes.BEGIN) == 1 and text.count(role_readmes.END) == 1
    assert role_readmes.updated(text, role_readmes.render(role_dir)) == text, (
        "%s differs from its argument spec, defaults or tags: run `python -m tests.role_readmes`" % readme
    )
    for entry, spec in _spec(role_dir).items():
        for name in spec.get("options") or {}:
            assert "- `%s` (" % name in text, "%s (entry point %s) is not in %s" % (name, entry, readme)


def _role_uses(node, role, found):
    """(vars, tasks_from) of every use of ``role`` in a parsed play list: role entries, import_role
    and include_role tasks, in plays and blocks."""
    if isinstance(node, list):
        for item in node:
            _role_uses(item, role, found)
        return found
    if not isinstance(node, dict):
        return found
    for entry in node.get("roles") or ():
        entry = {"role": entry} if isinstance(entry, str) else entry
        if entry.get("role", entry.get("name")) == role:
            found.append((dict(node.get("vars") or {}, **(entry.get("vars") or {})), None))
    for key in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
        if isinstance(node.get(key), dict) and node[key].get("name") == role:
            found.append((dict(node.get("vars") or {}), node[key].get("tasks_from")))
    for key in ("tasks", "pre_tasks", "post_tasks", "block", "rescue", "always"):
        _role_uses(node.get(key), role, found)
    return found


def _tasks(node):
    for play in node:
        for key in ("tasks", "pre_tasks", "post_tasks"):
            yield from play.get(key) or ()


@pytest.mark.parametrize("role_dir", [r for r in ROLES if (r / "tasks").is_dir()], ids=lambda r: r.name)
def test_readme_example_calls_the_role_by_fqcn_with_its_variables(role_dir):
    text = (role_dir / "README.md").read_text(encoding="utf-8")
    example = re.search(r"^## Example\n\n```yaml\n(.*?)^```", text, re.S | re.M)
    assert example, "the README of %s needs an example play (## Example, a yaml block)" % role_dir.name
    plays = yaml.safe_load(example.group(1))
    assert isinstance(plays, list) and all(isinstance(p, dict) and p.get("hosts") for p in plays)
    fqcn = "gpufleet.node.%s" % role_dir.name
    uses = _role_uses(plays, fqcn, [])
    assert uses, "the example does not call %s" % fqcn
    spec = _spec(role_dir)
    for variables, tasks_from in uses:
        entry = tasks_from or "main"
        assert entry in spec, "tasks_from %s is not an entry point of %s's argument spec" % (entry, fqcn)
        unknown = set(variables) - set(spec[entry].get("options") or {}) - SHARED
        assert not unknown, "the example sets what %s (%s) does not take: %s" % (fqcn, entry, sorted(unknown))
    for task in _tasks(plays):
        modules = [k for k in task if "." in k]
        assert len(modules) == 1, "every task of the example names its module by FQCN: %s" % task.get("name")


def test_a_changed_spec_makes_the_readme_stale(tmp_path):
    """The check can fail: a description changed in a copy of a role no longer renders its README."""
    role = tmp_path / "nccl_gate"
    shutil.copytree(role_readmes.ROLES / "nccl_gate", role)
    text = (role / "README.md").read_text(encoding="utf-8")
    assert role_readmes.updated(text, role_readmes.render(role)) == text
    spec = role / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace("Path or name of C(all_reduce_perf).", "Something else."))
    assert role_readmes.updated(text, role_readmes.render(role)) != text
    (role / "defaults" / "main.yml").write_text("nccl_gate_iters: 7\n")
    assert "`nccl_gate_iters` (int, default `7`)" in role_readmes.render(role)


@pytest.mark.parametrize(
    ("markup", "markdown"),
    [
        ("C(dict(zip(keys, item))) then V(true).", "`dict(zip(keys, item))` then `true`."),
        (
            "See M(gpufleet.node.files), P(gpufleet.node.vllm_server#role).",
            "See `gpufleet.node.files`, `gpufleet.node.vllm_server`.",
        ),
        (
            "O(gpufleet.node.nccl_allreduce#module:window) and O(x=y)",
            "`window` of `gpufleet.node.nccl_allreduce` and `x=y`",
        ),
        (
            ["I(one)", "B(two) L(the docs, https://example.invalid/a)."],
            "*one* **two** [the docs](https://example.invalid/a).",
        ),
        ("C(`tick`)", "`` `tick` ``"),
    ],
)
def test_markup_becomes_markdown(markup, markdown):
    assert role_readmes.markdown(markup) == markdown
