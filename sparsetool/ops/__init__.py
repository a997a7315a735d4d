"""Whole-checkpoint operations: prune, densify, report. Each streams one tensor at a time through
:mod:`sparsetool.checkpoint` and decides masks with :mod:`sparsetool.masks`."""
