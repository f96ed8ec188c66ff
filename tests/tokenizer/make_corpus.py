"""Deterministic tokenizer test corpus: varied lines (English prose, code in several languages,
CJK, Arabic and other scripts, emoji and ZWJ sequences, whitespace runs, numbers, mixed newlines,
text that looks like special tokens), built from fragments by a seeded generator.

    python make_corpus.py [N] > corpus.jsonl      # one JSON string per line (lines may hold newlines)
    python make_corpus.py --text MB > big.txt    # a long text for the throughput benchmark
"""

from __future__ import annotations

import json
import random
import sys

WORDS = (
    "the of and to in is was for that on with as by at from his her they have this which be or not are "
    "had but were one all their there been has when who will more no if out so said what up its about into "
    "than them can only other new some could time these two may then do first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three tokenizer inference cache memory kernel "
    "attention transformer gradient quantization bandwidth latency throughput hierarchy offload prefetch "
    "don't won't I'm you're we've they'll she'd it's isn't can't shouldn't I'VE YOU'RE WE'LL Don't O'Brien "
    "rock'n'roll naïve café résumé coöperate façade jalapeño Zürich Ångström Øresund Łódź straße"
).split()

PUNCT = [".", ",", ";", ":", "!", "?", "...", " -", " --", " —", " –", "'", '"', "(", ")", "[", "]", "{", "}", "…"]

CODE = [
    "def f(x):\n    return x * 2  # double\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, 世界\")\n}",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<div class=\"row\"><a href=\"https://example.com/?q=1&amp;r=2\">link</a></div>",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do wc -l \"$f\"; done",
    "template <typename T>\nstd::vector<T> take(const std::vector<T>& v, size_t n) { return {v.begin(), v.begin() + n}; }",
    "if __name__ == '__main__':\n\tmain()\n",
    "{\"name\": \"kvtier\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"kv-cache\"], \"ok\": true, \"n\": null}",
    "x = [i**2 for i in range(100) if i % 3 == 0]\r\nprint(sum(x))\r\n",
    "public static void main(String[] args) { System.out.println(\"Hi\"); }",
    "    \t  mixed_indent = True\n        else:\n            pass",
    "$ git commit -m 'fix: off-by-one in ring buffer' && git push origin HEAD:refs/for/main",
    "a_b_c = __init__.__dict__['x'] @ y // 2 ** 3 ^ ~z | w & 0xFF << 4 >> 1 != 0",
    "let re = /^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@example\\.org$/i;",
    "\\begin{equation} E = mc^2 \\end{equation} % LaTeX",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);return 0;}",
    "struct Point { double x, y; };  // 2-D\n",
]

CJK = [
    "今天天气很好，我们去公园散步吧。", "机器学习模型需要大量的数据进行训练。", "東京は日本の首都です。",
    "私はコーヒーが好きですが、紅茶も飲みます。", "カタカナとひらがなと漢字を混ぜた文章。",
    "안녕하세요, 만나서 반갑습니다.", "한국어 형태소 분석은 어렵습니다.", "繁體中文與简体中文並存。",
    "「引用」と『二重引用』。", "１２３４５６７８９０　全角数字とスペース",
]

OTHER_SCRIPTS = [
    "مرحبا بالعالم، كيف حالك اليوم؟", "اللغة العربية تكتب من اليمين إلى اليسار ١٢٣٤٥٦٧٨٩٠",
    "שלום עולם, מה שלומך?", "नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी में संयुक्ताक्षर: क्ष त्र ज्ञ श्र",
    "Привет, мир! Как дела? Ёжик в тумане.", "Γειά σου Κόσμε! Ωραία μέρα σήμερα.", "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Tiếng Việt có nhiều dấu thanh: à á ả ã ạ", "Ελληνικά και русский и 中文 mixed", "ქართული ენა", "Հայերեն լեզու",
    "e\u0301 a\u0308 n\u0303 combining marks", "ﬁ ﬂ ligatures and Ⅻ roman ⅻ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉",
]

EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸🇩🇪", "1️⃣", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "🤖", "✨", "🔥🔥🔥",
    "©️", "☕", "🫠", "👁️‍🗨️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🐈‍⬛", "🙋‍♀️", "🇺🇳",
]

SPACES = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", " \t ", "\n", "\n\n", "\n\n\n", "\r\n", "\r",
          "\r\n\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u200b", "\u2003", "\u202f",
          "\ufeff", "\x0b", "\x0c", " " * 17, "\t" * 9, "\n" * 7]

SPECIALS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>",
    "<end_of_turn>", "<start_of_image>", "<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<|eot_id|>",
    "<|begin_of_text|>", "<|im_start", "im_end|>", "<|im_start|>user\nhi<|im_end|>", "<0x41>", "<0xFF>",
    "<unused12>", "[multimodal]", "<repo_name>", "<file_sep>", "< |im_start| >", "<<bos>>", "<bos><bos>",
    "\u2581", "\u2581\u2581hello", "Ġ", "Ċ",
]


def number(rng: random.Random) -> str:
    kind = rng.randrange(10)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 20)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 8)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 10**9):,}"
    if kind == 3:
        return f"+1 ({rng.randrange(200, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
    if kind == 4:
        return f"{rng.randrange(1, 31):02d}/{rng.randrange(1, 13):02d}/{rng.randrange(1900, 2100)}"
    if kind == 5:
        return f"{rng.random():.3e}"
    if kind == 6:
        return "".join(rng.choice("٠١٢٣٤٥٦٧٨٩") for _ in range(rng.randrange(1, 8)))
    if kind == 7:
        return rng.choice(["½", "¾", "²", "³", "⁴", "₁₂", "①②③", "Ⅳ", "𝟙𝟚𝟛", "१२३", "๑๒๓"])
    if kind == 8:
        return f"v{rng.randrange(10)}.{rng.randrange(100)}.{rng.randrange(1000)}"
    return f"0x{rng.randrange(1 << 32):08X}"


def sentence(rng: random.Random) -> str:
    n = rng.randrange(3, 25)
    out = []
    for i in range(n):
        w = rng.choice(WORDS)
        r = rng.random()
        if i == 0 or r < 0.08:
            w = w.capitalize()
        elif r < 0.11:
            w = w.upper()
        out.append(w)
        if rng.random() < 0.12:
            out[-1] += rng.choice(PUNCT)
        if rng.random() < 0.05:
            out.append(number(rng))
    return " ".join(out) + rng.choice([".", "!", "?", "", "...", ":"])


def fragment(rng: random.Random, kind: int) -> str:
    if kind == 0:
        return sentence(rng)
    if kind == 1:
        return rng.choice(CODE)
    if kind == 2:
        s = rng.choice(CJK)
        return s[: rng.randrange(1, len(s) + 1)]
    if kind == 3:
        return rng.choice(OTHER_SCRIPTS)
    if kind == 4:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 5)))
    if kind == 5:
        return rng.choice(SPACES)
    if kind == 6:
        return number(rng)
    if kind == 7:
        return rng.choice(SPECIALS)
    if kind == 8:  # random code points from interesting ranges
        ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x52F), (0x600, 0x6FF), (0x900, 0x97F), (0x3040, 0x30FF),
                  (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x2000, 0x206F), (0xE000, 0xE0FF),
                  (0x1, 0x1F), (0x10000, 0x1034F), (0xFF00, 0xFFEF)]
        lo, hi = rng.choice(ranges)
        return "".join(chr(rng.randrange(lo, hi + 1)) for _ in range(rng.randrange(1, 12)))
    if kind == 9:
        return rng.choice(["https://huggingface.co/HuggingFaceTB/SmolLM2-135M?x=1#top", "user.name+tag@example.co.uk",
                           "C:\\Program Files\\kvtier\\bin", "/usr/local/lib/libpcre2-8.so.0", "## Heading\n- item **bold** _it_",
                           "| a | b |\n|---|---|\n| 1 | 2 |", "> quoted\n>> nested", "A.B.C. e.g. i.e. etc.", "'''docstring'''",
                           "''", "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D", "x's y'S z'Ll", "!!!???...,,,;;;"])
    return ""


def corpus(n: int = 2400, seed: int = 20240611) -> list[str]:
    rng = random.Random(seed)
    lines: list[str] = []
    # Every fixed fragment once, alone.
    for group in (CODE, CJK, OTHER_SCRIPTS, EMOJI, SPACES, SPECIALS):
        lines.extend(group)
    seen = set(lines)
    while len(lines) < n:
        k = rng.randrange(1, 7)
        parts = []
        for _ in range(k):
            kind = rng.choices(range(10), weights=[30, 10, 10, 8, 6, 12, 8, 6, 6, 4])[0]
            parts.append(fragment(rng, kind))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", " ", "", "\n", "  ", "\t"]))
        line = "".join(parts)
        if rng.random() < 0.05:
            line = " " + line
        if rng.random() < 0.05:
            line = line + rng.choice(["   ", "\n", "\t "])
        if rng.random() < 0.01:
            line = line * rng.randrange(20, 60)  # a few long lines
        if line and line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def big_text(megabytes: float, seed: int = 7) -> str:
    """A long text for throughput measurements: 20,000 corpus lines joined by newlines, repeated."""
    text = "\n".join(corpus(20000, seed=seed))
    target = int(megabytes * 1e6)
    while len(text.encode("utf-8")) < target:
        text += "\n" + text
    return text.encode("utf-8")[:target].decode("utf-8", errors="ignore")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--text":  # make_corpus.py --text MB > big.txt
        sys.stdout.write(big_text(float(sys.argv[2])))
        sys.exit(0)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2400
    for line in corpus(n):
        sys.stdout.write(json.dumps(line, ensure_ascii=True) + "\n")
