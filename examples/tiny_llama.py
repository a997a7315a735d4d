"""A tiny random Llama (4 layers, width 128) with a byte-level BPE tokenizer trained on a text
file, saved as the Hugging Face directory tiny-llama/ (docs/train.md uses it).

    python examples/tiny_llama.py [TEXT]      TEXT defaults to topics.txt

topics.txt, when it is the default and missing, is written first: the English help topics that
ship with Python (pydoc_data), one paragraph each, as docs/train.md makes it.

Needs the hf extra: pip install -e '.[hf]'.
"""

import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

if len(sys.argv) < 2 and not os.path.exists("topics.txt"):
    from pydoc_data.topics import topics

    with open("topics.txt", "w") as f:
        f.write("\n\n".join(topics[k] for k in sorted(topics)))
    print("wrote topics.txt (Python's help topics)", file=sys.stderr)
with open(sys.argv[1] if len(sys.argv) > 1 else "topics.txt") as f:
    text = f.read()
bpe = Tokenizer(models.BPE(unk_token="<unk>"))
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(
    [text],
    trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<unk>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ),
)
tok = PreTrainedTokenizerFast(
    tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="<s>"
)
config = LlamaConfig(
    num_hidden_layers=4,
    hidden_size=128,
    intermediate_size=384,
    num_attention_heads=4,
    vocab_size=len(tok),
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=1,
)
LlamaForCausalLM(config).save_pretrained("tiny-llama")
tok.save_pretrained("tiny-llama")
