"""Deterministic multilingual text for the tokenizer tests and benchmark.

lines(n, seed) gives n lines (no '\\n', no '\\x1f': the separators of
`kiln tokenize`) mixing real English (the descriptions scikit-learn ships,
Python's own module docstrings) with words drawn, by a seeded random
generator, from Unicode ranges: Latin with accents (precomposed and with
combining marks), CJK, Cyrillic, Arabic, Devanagari, Greek, Hangul,
emoji (with ZWJ sequences and skin tones), digits of several scripts,
punctuation, odd spaces, control and format characters, the tokenizers'
special-token strings, and very long words. Only characters that Python's
unicodedata knows are assigned are used, so the text is the same str for
the library and bytes for kiln.
"""
import pathlib
import random
import sys
import unicodedata


def _assigned(lo, hi):
    return [chr(c) for c in range(lo, hi + 1)
            if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) not in ("Cn", "Cs")]


_SCRIPTS = {
    "latin": _assigned(0x41, 0x5A) + _assigned(0x61, 0x7A) * 3 + _assigned(0xC0, 0x24F),
    "cjk": _assigned(0x4E00, 0x9FFF) + _assigned(0x3040, 0x30FF) + _assigned(0x20000, 0x200FF),
    "cyrillic": _assigned(0x400, 0x4FF),
    "arabic": _assigned(0x600, 0x6FF),
    "devanagari": _assigned(0x900, 0x97F),
    "greek": _assigned(0x370, 0x3FF),
    "hangul": _assigned(0xAC00, 0xAD00),
    "emoji": _assigned(0x1F300, 0x1F64F) + _assigned(0x1F900, 0x1F9FF) + _assigned(0x2600, 0x26FF),
    "digits": _assigned(0x30, 0x39) * 5 + ["\u0660", "\u0967", "\uff13", "\u00b2", "\u2155", "\u2167"],
    "punct": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + _assigned(0x2010, 0x205E) + _assigned(0x3000, 0x303F)
    + ["\u00bf", "\u00a1", "\u061f", "\u0964", "\u2e4f", "\u2e52"],
    "marks": _assigned(0x300, 0x36F) + ["\u0903", "\u20dd", "\u0e48"],
    "space": [" ", " ", " ", "\t", "\u00a0", "\u3000", "\u2009", "\u200b", "\u0085", "\u2028", "\r"],
    "control": [chr(c) for c in range(0, 32) if c not in (10, 31)] + ["\x7f", "\u00ad", "\ufeff", "\u200d",
                                                                      "\ufffd", "\U000e0001", "\ue000"],
}

_SPECIALS = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "<s>", "</s>", "<mask>", "<pad>", "<unk>"]
_ZWJ = ["\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F44D\U0001F3FD", "\U0001F3F3\uFE0F\u200D\U0001F308"]


def _real_lines():
    """English (and code) the venv already holds: scikit-learn's dataset
    descriptions and the docstrings of Python's standard library."""
    out = []
    try:
        import sklearn.datasets
        d = pathlib.Path(sklearn.datasets.__file__).parent / "descr"
        for f in sorted(d.glob("*.rst")):
            out += [ln for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except ImportError:
        pass
    lib = pathlib.Path(random.__file__).parent
    for name in ["random.py", "textwrap.py", "difflib.py", "argparse.py", "collections/__init__.py",
                 "email/message.py", "json/decoder.py", "unicodedata.py", "locale.py", "calendar.py"]:
        p = lib / name
        if p.is_file():
            out += [ln for ln in p.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    return [ln.replace("\x1f", " ") for ln in out]


def _word(r):
    kind = r.choices(list(_SCRIPTS), weights=[30, 10, 8, 6, 6, 4, 3, 4, 5, 8, 3, 0, 1])[0]
    pool = _SCRIPTS[kind]
    n = r.choice([1, 1, 2, 3, 4, 5, 6, 8, 12])
    w = "".join(r.choice(pool) for _ in range(n))
    if kind == "latin" and r.random() < 0.3:  # accents as combining marks
        w = "".join(c + (r.choice(_SCRIPTS["marks"]) if r.random() < 0.3 else "") for c in w)
    if r.random() < 0.1:
        w = unicodedata.normalize(r.choice(["NFD", "NFC", "NFKD"]), w)
    return w


def _line(r, real):
    roll = r.random()
    if roll < 0.35:
        s = r.choice(real)
        if r.random() < 0.3:  # real text with foreign words in it
            words = s.split(" ")
            words.insert(r.randrange(len(words) + 1), _word(r))
            s = " ".join(words)
        return s
    parts = []
    for _ in range(r.randint(0, 24)):
        x = r.random()
        if x < 0.03:
            parts.append(r.choice(_SPECIALS))
        elif x < 0.05:
            parts.append(r.choice(_ZWJ))
        elif x < 0.07:
            parts.append("".join(r.choice(_SCRIPTS["control"]) for _ in range(r.randint(1, 3))))
        elif x < 0.075:  # a very long word
            pool = _SCRIPTS[r.choice(["latin", "cjk", "cyrillic", "digits", "emoji"])]
            parts.append("".join(r.choice(pool) for _ in range(r.randint(101, 1500))))
        else:
            parts.append(_word(r))
        parts.append(r.choice(_SCRIPTS["space"]) if r.random() < 0.2 else " ")
    return "".join(parts)


def lines(n, seed=31):
    r = random.Random(seed)
    real = _real_lines() or ["The quick brown fox jumps over the lazy dog."]
    out = []
    for _ in range(n):
        s = _line(r, real).replace("\n", " ").replace("\x1f", " ")
        out.append(s)
    # Edge cases, always present.
    out[:0] = ["", " ", "  leading and trailing  ", "[CLS]", "a[SEP]b", "<s>x</s>", "\u0130stanbul", "ΣΑΣ",
               "caf\u00e9 cafe\u0301", "\u3000", "\x00", "\ufffd", "\U0001F600" * 3, "x" * 99, "y" * 100, "z" * 101]
    return out[:n] if n >= 16 else out


if __name__ == "__main__":
    for ln in lines(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
        print(ln)
