"""Build glue: compiles the C core (csrc/) through cffi and ships the schemas.

Everything declarative lives in pyproject.toml.
"""
from setuptools import setup

setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
)
