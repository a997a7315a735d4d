"""``sparsetool train``: sparse training of sparsetool's GPT (:mod:`sparsetool.models.gpt`) or a
Hugging Face model: its data (:mod:`.data`), the options of a run (:mod:`.trainconfig`), the loop
(:mod:`.loop`), the run directory (:mod:`.runstate`: start, resume, save, stop) and its files
(:mod:`.runfiles`). The sparse-training algorithms live in :mod:`.algorithms`.

Kept free of imports so that ``sparsetool.train.algorithms`` and the CLI load only what they use.
"""
