"""spotring's tests, sorted by kind: unit/, providers/, e2e/, terraform/ (tests/README.md).

A package so that bench/ and the tests import the fakes as ``tests.fakes``.
"""
