"""Fixtures shared by the test modules: netns_hosts (namespaced test hosts, tests/netns.py)."""

from tests.netns import netns_hosts  # noqa: F401
