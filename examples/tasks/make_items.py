"""Write items.jsonl, the data of the two example tasks in this directory (pick_ending.yaml,
line_nll.yaml), for `sparsetool eval --tasks pick_ending,line_nll --include-path examples/tasks`
run from the directory that holds examples/ (the YAML files name their data relative to it).

    python examples/tasks/make_items.py

Each item is a line of six words drawn from twelve fixed sentences (the second half follows from
the first): "context" is its first three words, "choices" its true ending and another line's, in a
random order, "label" the index of the true one, and "text" the whole line. Seeded: the same file
every time. The tests build tasks the same way (tests/ops/eval/test_tasks.py).
"""

import json
import random
from pathlib import Path

NOUNS = [
    "model",
    "weight",
    "mask",
    "layer",
    "token",
    "text",
    "tensor",
    "matrix",
    "head",
    "block",
    "kernel",
    "row",
]
VERBS = [
    "prunes",
    "keeps",
    "drops",
    "reads",
    "writes",
    "masks",
    "scores",
    "sorts",
    "ranks",
    "packs",
    "loads",
    "counts",
]
ADJS = [
    "sparse",
    "dense",
    "small",
    "large",
    "quiet",
    "bright",
    "early",
    "late",
    "empty",
    "full",
    "plain",
    "round",
]


def items(n: int = 24, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    fixed = [f"the {ADJS[i]} {NOUNS[i]} {VERBS[i]} every {NOUNS[(i + 5) % 12]}" for i in range(12)]
    lines = [rng.choice(fixed).split() for _ in range(200)]
    out = []
    for words in lines[:n]:
        ending = " ".join(words[3:])
        other = ending
        while other == ending:
            other = " ".join(rng.choice(lines)[3:])
        label = rng.randrange(2)
        out.append(
            {
                "context": " ".join(words[:3]),
                "label": label,
                "text": " ".join(words),
                "choices": [other, ending] if label else [ending, other],
            }
        )
    return out


if __name__ == "__main__":
    path = Path(__file__).resolve().parent / "items.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items()))
    print(f"wrote {path}")
