# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible Galaxy accepts the collection: the artifact `ansible-galaxy collection build` makes of
this tree is imported by galaxy-importer (what Galaxy and Automation Hub run on upload; pinned, in
a venv of its own made by tests/galaxy_importer/setup.sh) with no error and no warning but the
ones listed below with their reason; the import finds every role with its README and every module,
filter and callback with the documentation ansible-doc renders. The importer's configuration is
tests/galaxy_importer/galaxy-importer.cfg (ansible-doc, ansible-lint and the changelog check on;
ansible-test's container off: tests/sanity/run.sh runs ansible-test sanity).

The importer's records are read whole from the driver's JSON (tests/galaxy_importer/
import_collection.py), never from lines of its text output. Its run time is printed: 48 to 68 s for
the collection (most of it ansible-lint), 16 to 20 s for the broken copy that the last test
imports; benchmark figures, not assertions.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # two imports, one of them with ansible-lint

REPO = Path(__file__).resolve().parents[2]
IMPORTER = REPO / "tests" / "galaxy_importer"
VENV = REPO / ".venv-importer"
# ansible-lint's findings, as the importer logs them (its --format=pep8): path:line: rule: text
LINT = re.compile(r"^(?P<path>[^:\s]+):(?P<line>\d+): (?P<rule>[\w\[\]-]+): (?P<text>.*)$")

# Warnings Galaxy prints and still imports, each with why it stays: (rule, path) -> reason.
ACCEPTED_LINT = {
    ("role-name", "roles/_common"): (
        "the private role that holds the names every role shares is named with a leading underscore, as "
        "prometheus-community's _common (a content name Galaxy accepts; ansible-lint's role-name warns)"
    ),
}


def _env():
    """The test command's environment without its Ansible settings (Galaxy runs with none of ours)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}


def _build(src, out):
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    res = subprocess.run(
        [str(galaxy), "collection", "build", "--output-path", str(out), str(src)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (tarball,) = Path(out).glob("gpufleet-node-*.tar.gz")
    return tarball


def _import(artifact, work):
    """The importer's report: {records: [{level, logger, message}], exception, result, config}."""
    setup = subprocess.run(["bash", str(IMPORTER / "setup.sh")], capture_output=True, text=True, timeout=900)
    assert setup.returncode == 0, "galaxy-importer's venv: " + setup.stdout + setup.stderr[-3000:]
    env = dict(
        _env(),
        GALAXY_IMPORTER_TMP_ROOT_DIR=str(work),
        GALAXY_IMPORTER_ANSIBLE_LOCAL_TMP=str(work / "ansible-local"),
    )
    report = work / "report.json"
    start = time.monotonic()
    res = subprocess.run(
        [str(VENV / "bin" / "python"), str(IMPORTER / "import_collection.py"), str(artifact), str(report)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    print("galaxy-importer on %s: %.1f s" % (artifact.name, time.monotonic() - start))
    assert report.is_file(), "the driver wrote no report (rc %d): %s" % (res.returncode, res.stderr[-3000:])
    return json.loads(report.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return _build(REPO, tmp_path_factory.mktemp("galaxy-build"))


@pytest.fixture(scope="module")
def imported(artifact, tmp_path_factory):
    return _import(artifact, tmp_path_factory.mktemp("galaxy-import"))


def _git_files():
    res = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
    )
    return set(res.stdout.decode().split("\0")) - {""}


def test_the_artifact_ships_the_collection_and_no_state_or_cache(artifact):
    """Every file of the artifact is one git would track: galaxy.yml's build_ignore keeps the venvs,
    the lab's state, the caches and the lab's generated inventory out."""
    with tarfile.open(artifact) as tar:
        files = json.load(tar.extractfile("FILES.json"))["files"]
        manifest = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
    shipped = {f["name"] for f in files if f["ftype"] == "file"}
    assert not shipped - _git_files(), "the artifact ships files git ignores: %s" % sorted(shipped - _git_files())[:20]
    left_out = ("lab/", "benchmarks/", "scripts/", ".ci/", "inventories/lab/", ".collections/")
    assert not [f for f in shipped if f.startswith(left_out)]
    assert {"README.md", "meta/runtime.yml", "playbooks/site.yml", "roles/nccl_gate/README.md"} <= shipped
    assert manifest["dependencies"] == {}


def test_galaxy_importer_reports_no_error(imported):
    errors = [r for r in imported["records"] if r["level"] in ("ERROR", "CRITICAL")]
    assert not errors, "\n".join(r["message"][:2000] for r in errors)
    assert imported["exception"] is None and imported["result"] is not None
    assert imported["config"]["run_ansible_doc"] is True and imported["config"]["run_ansible_lint"] is True


def test_galaxy_importer_warns_only_of_what_is_accepted(imported):
    unexplained = []
    for record in imported["records"]:
        if record["level"] != "WARNING":
            continue
        finding = LINT.match(record["message"])
        key = (finding["rule"], finding["path"]) if finding else None
        if key not in ACCEPTED_LINT:
            unexplained.append(record["message"])
    assert not unexplained, "\n".join(unexplained)


def _exported_filters():
    names = set()
    for path in sorted((REPO / "plugins" / "filter").glob("*.py")):
        module = importlib.import_module("ansible_collections.gpufleet.node.plugins.filter." + path.stem)
        names.update(module.FilterModule().filters())
    return names


def _documented(path):
    text = path.read_text(encoding="utf-8")
    return "DOCUMENTATION" in text


def test_the_import_finds_every_role_and_every_plugin_with_its_documentation(imported):
    result = imported["result"]
    assert result["requires_ansible"] == yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    assert result["docs_blob"]["collection_readme"]["name"] == "README.md"
    docs = {}
    for item in result["docs_blob"]["contents"]:
        docs.setdefault((item["content_type"], item["content_name"]), []).append(item)

    roles = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta").is_dir())
    for role in roles:
        (item,) = docs[("role", role)]
        assert item["readme_file"] == "README.md", role
        # Galaxy's page of the role shows its variables (the README's generated part)
        spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for entry in spec.values():
            for option in entry.get("options") or {}:
                assert "<code>%s</code>" % option in item["readme_html"], (role, option)

    expected = {("module", p.stem) for p in (REPO / "plugins" / "modules").glob("*.py")}
    expected |= {("filter", name) for name in _exported_filters()}
    expected |= {("callback", p.stem) for p in (REPO / "plugins" / "callback").glob("*.py") if _documented(p)}
    undocumented = sorted("%s %s" % key for key in expected if not any(i["doc_strings"] for i in docs.get(key, ())))
    assert not undocumented, "imported without documentation: %s" % ", ".join(undocumented)
    for kind, name in expected:
        for item in docs[(kind, name)]:
            if item["doc_strings"]:
                assert item["doc_strings"]["doc"]["plugin_name"] == "gpufleet.node.%s" % name


def test_requires_ansible_is_what_the_controller_and_the_roles_state():
    """meta/runtime.yml's floor is the ansible-core line requirements.txt pins (the plugins use its
    APIs) and every role's min_ansible_version."""
    floor = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    (pin,) = re.findall(r"^ansible-core==(\d+\.\d+)\.", (REPO / "requirements.txt").read_text(), re.M)
    assert floor == ">=%s.0" % pin
    for meta in sorted((REPO / "roles").glob("*/meta/main.yml")):
        assert str(yaml.safe_load(meta.read_text())["galaxy_info"]["min_ansible_version"]) == pin, meta


def test_a_role_without_readme_or_a_filter_without_docs_fails_the_import(tmp_path):
    """What the importer said before the READMEs and the filter docs: an ansible-doc error for the
    undocumented filter, and the import refused for the role without a README."""
    src = tmp_path / "src"
    files = sorted(f for f in _git_files() if not f.startswith(("lab/", "benchmarks/", ".ci/", ".collections/")))
    for rel in files:
        if (REPO / rel).is_file() and not (REPO / rel).is_symlink():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((REPO / rel).read_bytes())
    (src / "roles" / "pcie_p2p" / "README.md").unlink()
    (src / "plugins" / "filter" / "kv_plan.yml").unlink()
    (tmp_path / "build").mkdir()
    (tmp_path / "work").mkdir()
    report = _import(_build(src, tmp_path / "build"), tmp_path / "work")
    errors = [r["message"] for r in report["records"] if r["level"] == "ERROR"]
    assert report["result"] is None
    assert report["exception"] == {"type": "ContentLoadError", "message": "No role readme found."}
    assert any("ansible-doc" in e and "gpufleet.node.kv_plan Missing documentation" in e for e in errors), errors
