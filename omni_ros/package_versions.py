"""Installed versions of the packages whose code decides what a built program computes (programs, kernel caches)."""

from __future__ import annotations


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """`packages`' installed versions ("unknown" for one that is not installed), in the order given."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in packages:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "unknown"
    return versions
