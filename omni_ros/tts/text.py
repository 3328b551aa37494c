"""Text clean-up and splitting ahead of synthesis.

Engines that synthesize a whole piece of text before returning any audio
(Piper runs one ONNX call per piece) start speaking sooner when the text is
cut into pieces that grow: a short first piece, then longer ones, each ending
at a sentence or clause boundary where one is near, so the cut is where a
speaker would pause anyway.
"""

from __future__ import annotations

import re
import unicodedata

# Control, format, surrogate, private-use and unassigned code points: nothing
# an engine can pronounce, and some (NUL, lone surrogates) break C libraries.
_DROP_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn"}
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*$")
_CLAUSE_END = re.compile(r"[,;:\u2013\u2014]+[\"')\]]*$")


def clean_text(text: str) -> str:
    """Normalize Unicode, drop unpronounceable code points, collapse whitespace."""
    text = unicodedata.normalize("NFKC", text)
    kept = []
    for ch in text:
        if ch in "\t\n\r\f\v":
            kept.append(" ")
        elif unicodedata.category(ch) not in _DROP_CATEGORIES:
            kept.append(ch)
    return " ".join("".join(kept).split())


def split_text(text: str, first_words: int = 6, max_chars: int = 240) -> list[str]:
    """Cut cleaned text into pieces for piecewise synthesis, in order.

    No piece spans a sentence end. Piece k holds at most `first_words * 2**k`
    words and `max_chars` characters; when a piece must end inside a sentence it
    ends at the last clause mark (comma, semicolon, colon, dash) in its second
    half if there is one.
    """
    words = text.split()
    pieces: list[str] = []
    limit = max(1, first_words)
    start = 0
    while start < len(words):
        end = start
        chars = 0
        cut = None
        while end < len(words):
            word = words[end]
            if end > start and (end - start >= limit or chars + 1 + len(word) > max_chars):
                break
            chars += len(word) + (1 if end > start else 0)
            end += 1
            if _SENTENCE_END.search(word):
                cut = end
                break
        if cut is None:
            cut = end
            if end < len(words):
                # Ending mid-sentence: back off to a clause mark if one is near.
                for i in range(end - 1, start + (end - start) // 2 - 1, -1):
                    if _CLAUSE_END.search(words[i]):
                        cut = i + 1
                        break
        pieces.append(" ".join(words[start:cut]))
        start = cut
        limit = min(limit * 2, 1 << 16)
    return pieces
