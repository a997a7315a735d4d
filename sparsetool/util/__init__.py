"""Helpers the whole library shares, not part of its public API: option values (``options``),
config files (``configfile``), counts that agree with their nouns (``wording``), the thread pool
(``workers``), torch's threads (``threads``), the memory plan of the commands that run a model
(``memory``), progress callbacks (``progress``), float bit layouts (``floatbits``), the built-in
text corpora (``corpus``), the version (``version``) and a package's names imported on first use
(``lazy``).

All torch-free: the CLI checks options with them before torch is imported.
"""
