"""Prompt tokenizers: ids, masks, truncation, and the config checks around them."""

import numpy as np
import pytest

from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.tokenizer import ByteTokenizer, TokenizerConfig, WordTokenizer, make_tokenizer
from omni_ros.sim.scene import COLORS
from omni_ros.sim.task import TEMPLATES, make_prompt


def test_byte_tokenizer_ids_mask_and_truncation():
    tokens, mask = ByteTokenizer().encode("Hi", 6)
    assert tokens.tolist() == [256, ord("h"), ord("i"), ord("\n"), 258, 258]
    assert mask.tolist() == [True] * 4 + [False] * 2
    tokens, mask = ByteTokenizer().encode("a long prompt", 4)
    assert mask.all() and tokens[0] == 256


def test_word_tokenizer_one_token_per_word():
    tok = WordTokenizer(["reach", "the", "red", "blue", "block"])
    tokens, mask = tok.encode("Reach the RED block!", 8)
    # BOS, reach, the, red, block, "!" (unknown), EOS, PAD
    assert tokens.tolist() == [1, 4, 5, 6, 8, 3, 2, 0]
    assert mask.tolist() == [True] * 7 + [False]
    red, _ = tok.encode("reach the red block", 8)
    blue, _ = tok.encode("reach the blue block", 8)
    assert (red != blue).sum() == 1, "prompts that differ in one word differ in one token"
    assert tok.vocab_size == 9


def test_word_tokenizer_truncates_and_rejects_bad_vocab():
    tokens, mask = WordTokenizer(["a"]).encode("a a a a a", 3)
    assert tokens.tolist() == [1, 4, 4] and mask.all()
    with pytest.raises(ValueError, match=r"needs tokenizer\.vocab"):
        WordTokenizer([])
    with pytest.raises(ValueError, match="repeated"):
        WordTokenizer(["red", "Red"])


def test_make_tokenizer_kinds():
    assert isinstance(make_tokenizer(TokenizerConfig()), ByteTokenizer)
    assert isinstance(make_tokenizer(TokenizerConfig(kind="words", vocab=["x"])), WordTokenizer)
    with pytest.raises(ValueError, match="'bytes', 'words', 'hf' or 'sentencepiece'"):
        make_tokenizer(TokenizerConfig(kind="bpe"))


def test_vocab_must_fit_the_embedding():
    with pytest.raises(ValueError, match="vocab_size 10 is too small"):
        ModelConfig(vocab_size=10, tokenizer=TokenizerConfig(kind="words", vocab=[f"w{i}" for i in range(7)]))


def test_demo_vocabulary_covers_every_sim_prompt():
    cfg = preset("demo")
    tok = make_tokenizer(cfg.tokenizer)
    for color in COLORS:
        for template in range(len(TEMPLATES)):
            tokens, mask = tok.encode(make_prompt(color, template), cfg.tokenizer.max_tokens)
            assert mask[-1] == False or tokens[-1] == WordTokenizer.EOS, "prompt truncated"  # noqa: E712
            assert WordTokenizer.UNK not in tokens[mask], make_prompt(color, template)
            assert tokens[mask][-1] == WordTokenizer.EOS
    assert np.unique([tok.encode(make_prompt(c), 12)[0][3] for c in COLORS]).size == len(COLORS)
