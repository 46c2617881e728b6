"""The suite's directories, for tests that run a support script or read a file of the repository."""
import os

#: tests/support: the helper scripts run as children, and the modules tests import
SUPPORT = os.path.dirname(os.path.abspath(__file__))
#: tests/
TESTS = os.path.dirname(SUPPORT)
#: the repository's root
ROOT = os.path.dirname(TESTS)
