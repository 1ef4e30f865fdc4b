# SPDX-License-Identifier: GPL-3.0-or-later
"""What runs on a managed node runs under the node's Python, not the controller's: the modules,
module_utils and the node-side agents (roles/*/files/*.py) compile, import, and pass their unit
tests under the Pythons of the lab's other Debian releases, bullseye's 3.9 and trixie's 3.13
(bookworm's 3.11 is the controller's, which every other tier runs).

Each interpreter is the release's own, from the root filesystem the lab boots those nodes on
(lab/rootfs.py; built once by debootstrap and cached, scripts/setup.sh starts the builds), run
from the controller with the tree's own loader and libraries.  The unit tests that run there are
those of tests/unit that need nothing but the standard library, pytest and module_utils (chosen
by their imports, below); pytest itself is the 3.9-compatible set of pure-Python wheels pinned in
tests/node_pythons/requirements.txt, which scripts/setup.sh downloads.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lab import rootfs
from lab.preflight import LabError

REPO = Path(__file__).resolve().parents[2]
COLLECTION_PATH = REPO / ".collections"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
#: The lab's releases whose Python is not the controller's: their python3 versions are the ones
#: real fleets run below and above it (Debian 11 / RHEL 9: 3.9; Debian 13: 3.13).
RELEASES = ("bullseye", "trixie")
MODULE_UTILS = "ansible_collections.gpufleet.node.plugins.module_utils"


def node_side_files():
    """Every file that runs on a managed node: modules, module_utils, the roles' agents."""
    files = sorted(REPO.glob("plugins/modules/*.py"))
    files += sorted(p for p in REPO.glob("plugins/module_utils/**/*.py"))
    files += sorted(REPO.glob("roles/*/files/*.py"))
    return files


def pytest_wheels():
    """Where scripts/setup.sh put the wheels of requirements.txt (keyed by the file's hash)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gpufleet" / f"node-pytest-{hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]}"


def _imports(path):
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return tree, names


def _plain(path, seen=None):
    """Whether a test file needs only the standard library, pytest, module_utils and test helpers
    that themselves need no more, and no fixture of tests/conftest.py (not loaded there)."""
    seen = seen if seen is not None else set()
    if path in seen:
        return True
    seen.add(path)
    tree, names = _imports(path)
    for name in names:
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top == "pytest" or name.startswith(MODULE_UTILS):
            continue
        helper = REPO / (name.replace(".", "/") + ".py")
        if top == "tests" and helper.is_file() and _plain(helper, seen):
            continue
        return False
    conftest_fixtures = {"lab_node", "any_profile", "ansible_env", "run_module", "session_lab"}
    args = {
        a.arg for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for a in n.args.args
    }
    return not (args & conftest_fixtures)


def plain_unit_tests():
    return [p for p in sorted((REPO / "tests/unit").glob("test_*.py")) if _plain(p)]


class NodePython:
    def __init__(self, release, version, argv):
        self.release, self.version, self.argv = release, version, argv

    def run(self, args, pythonpath=(), timeout=600):
        env = {
            "PATH": "/usr/bin:/bin",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",  # nothing of another Python's written into the checkout
            "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
        }
        return subprocess.run(
            [*self.argv, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout, check=False
        )


@pytest.fixture(scope="module", params=RELEASES)
def node_python(request):
    release = request.param
    if os.geteuid() != 0:
        pytest.skip(f"building the {release} root filesystem needs root (debootstrap)")
    try:
        record = rootfs.ensure(release, log=lambda msg: print(msg, file=sys.stderr))
    except LabError as exc:
        if "apt-get install" in str(exc) and not rootfs.built(release):  # a missing program
            pytest.skip(str(exc))
        raise
    return NodePython(release, record["python"], rootfs.interpreter(release))


COMPILE = """
import json, sys
errors = {}
for path in sys.argv[1:]:
    try:
        compile(open(path, "rb").read(), path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        errors[path] = f"{exc.msg} (line {exc.lineno})"
print(json.dumps({"version": sys.version.split()[0], "errors": errors}))
"""

IMPORT = """
import importlib, importlib.util, json, sys, traceback
errors = {}
for name, path in json.loads(sys.argv[1]):
    try:
        if path is None:
            importlib.import_module(name)
        else:  # a module or agent file, imported as a module (its main() not run)
            spec = importlib.util.spec_from_file_location(name, path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except BaseException:
        errors[path or name] = traceback.format_exc(limit=-3)
print(json.dumps(errors))
"""


def test_node_side_files_compile(node_python):
    files = [str(p) for p in node_side_files()]
    assert len(files) > 20, f"too few node-side files found under {REPO}: {files}"
    proc = node_python.run(["-c", COMPILE, *files])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["version"] == node_python.version
    assert result["errors"] == {}, f"{node_python.release}'s Python {node_python.version}: {result['errors']}"


def _ansible_module_utils(tmp_path):
    """A path entry holding ansible-core's package (what AnsiballZ ships a node: ansible.module_utils)."""
    import ansible

    entry = tmp_path / "ansible-core"
    entry.mkdir()
    (entry / "ansible").symlink_to(Path(ansible.__file__).parent)
    return entry


def test_node_side_files_import(node_python, tmp_path):
    """Every module_utils module by its collection name, every module and agent file as a module:
    what Python checks only when it runs a line (a 3.10 call, an annotation evaluated) shows here."""
    targets = []
    for path in node_side_files():
        rel = path.relative_to(REPO)
        if rel.parts[:2] == ("plugins", "module_utils"):
            parts = list(rel.with_suffix("").parts[2:])
            if parts[-1] == "__init__":
                parts = parts[:-1]
            targets.append([".".join([MODULE_UTILS, *parts]).rstrip("."), None])
        else:
            targets.append([f"gpufleet_node_side_{path.stem}", str(path)])
    proc = node_python.run(["-c", IMPORT, json.dumps(targets)], [COLLECTION_PATH, _ansible_module_utils(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    errors = json.loads(proc.stdout)
    assert errors == {}, f"{node_python.release}'s Python {node_python.version}:\n" + "\n".join(
        f"{name}:\n{text}" for name, text in errors.items()
    )


def test_plain_unit_tests_pass(node_python, tmp_path):
    wheels = sorted(pytest_wheels().glob("*.whl"))
    if not wheels:
        pytest.skip(f"no pytest wheels for the node Pythons in {pytest_wheels()}: run scripts/setup.sh")
    site = tmp_path / "site"
    for wheel in wheels:  # pure-Python wheels: unpacking one is installing it
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    tests = plain_unit_tests()
    assert len(tests) >= 5, f"too few unit tests need only the standard library and module_utils: {tests}"
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")  # the repository's names markers and options of the controller's pytest
    args = ["-m", "pytest", "-c", str(ini), "--rootdir", str(REPO), "--noconftest", "-p", "no:cacheprovider", "-q"]
    proc = node_python.run([*args, *map(str, tests)], [site, COLLECTION_PATH, REPO])
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0 and " passed" in summary, (
        f"{node_python.release}'s Python {node_python.version}: unit tests "
        f"{[p.name for p in tests]}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
