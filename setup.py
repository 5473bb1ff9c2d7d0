"""Package list for the root-level folders that map into the `moetune` namespace.

pyproject.toml holds all metadata and the folder -> package mapping (`package-dir`); this file only
enumerates sub-packages, so that a new backend folder (kernels/backends/<name>/) ships without editing
any list.
"""

from setuptools import find_packages, setup

ROOTS = ("kernels", "tuner", "db", "configs", "service", "integrations", "cli")

packages = []
for root in ROOTS:
    packages.append(f"moetune.{root}")
    packages += [f"moetune.{root}.{sub}" for sub in find_packages(where=root)]

setup(packages=packages)
