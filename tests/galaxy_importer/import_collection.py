# SPDX-License-Identifier: GPL-3.0-or-later
"""Import a built collection with galaxy-importer, as Ansible Galaxy does on upload, and write what
the importer reported as JSON: every record it logged (level and message) and its result (the
contents it found, their documentation, the README renders), or null when the import failed.

Run with the importer's venv (tests/galaxy_importer/setup.sh), by
tests/integration/test_galaxy_import.py:

    .venv-importer/bin/python tests/galaxy_importer/import_collection.py ARTIFACT.tar.gz OUT.json

The importer's command line (``python -m galaxy_importer.main``) prints the same records as text
and exits 0 after logging errors (an ansible-doc failure, for one); this keeps each record whole.
The importer's configuration is galaxy-importer.cfg beside this file unless GALAXY_IMPORTER_CONFIG
names another; GALAXY_IMPORTER_<KEY> variables override single keys.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append({"level": record.levelname, "logger": record.name, "message": record.getMessage()})


def main(artifact, out):
    here = Path(__file__).resolve().parent
    os.environ.setdefault("GALAXY_IMPORTER_CONFIG", str(here / "galaxy-importer.cfg"))
    # Galaxy's importer runs with no Ansible settings of ours (the repository's ansible.cfg names
    # callbacks and a strategy the artifact's ansible-doc and ansible-lint need not know).
    for key in [k for k in os.environ if k.startswith("ANSIBLE_")]:
        del os.environ[key]
    # ansible-doc and ansible-lint are found on PATH: this venv's, at the pinned versions.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

    from galaxy_importer import __version__, collection, config
    from galaxy_importer.exceptions import ImporterError

    cfg = config.Config(config_data=config.ConfigFile.load())
    logger = logging.getLogger("gpufleet.galaxy_import")
    logger.setLevel(getattr(logging, str(cfg.log_level_main).upper(), logging.INFO))
    handler = _Records()
    logger.addHandler(handler)

    name = Path(artifact).name
    namespace, coll, version = name[: -len(".tar.gz")].split("-", 2)
    result, exception = None, None
    with open(artifact, "rb") as fh:
        try:
            result = collection.import_collection(
                fh, collection.CollectionFilename(namespace, coll, version), logger=logger, cfg=cfg
            )
        except ImporterError as exc:  # what Galaxy reports as "the import failed"
            exception = {"type": type(exc).__name__, "message": str(exc)}
            logger.error("The import failed for the following reason: %s", exc)
        except Exception as exc:  # reported whole, as the importer's CLI does
            exception = {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
            logger.error("Unexpected error occurred: %s", exc)
    report = {
        "importer_version": __version__,
        "config": dict(sorted(vars(cfg).items())),
        "records": handler.records,
        "exception": exception,
        "result": result,
    }
    Path(out).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return 0 if result is not None else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
