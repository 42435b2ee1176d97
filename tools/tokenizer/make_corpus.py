#!/usr/bin/env python3
"""Builds the tokenizer parity corpus: testdata/tokenizer/corpus.jsonl.gz.

Deterministic (seeded) and self-contained: every phrase below is written for
this corpus. Each output line is one JSON string, a test case that may itself
contain newlines. Covers prose in many languages, CJK, emoji and ZWJ
sequences, code with tabs, runs of spaces and newlines, numbers, special
tokens inside text, empty and whitespace-only strings, and random Unicode.

    python3 tools/tokenizer/make_corpus.py [--lines 12000] [--out PATH]
"""
import argparse
import gzip
import json
import os
import random

PROSE = {
    "en": [
        "The quick brown fox jumps over the lazy dog.",
        "It's a truth universally acknowledged that we'll need more tests.",
        "She said: \"I can't believe they've already shipped it!\"",
        "In 1969, Apollo 11 landed on the Moon; the crew returned on July 24.",
        "Don't panic -- the scheduler will preempt the sequence and retry.",
        "HELLO WORLD, I'M SHOUTING AND YOU'RE LISTENING, AREN'T YOU?",
        "Prices rose 3.75% year-over-year, from $1,234.56 to $1,280.85.",
        "e-mail me at someone@example.com or visit https://example.org/a?b=c&d=e#f",
        "Well... that's odd (isn't it?) -- but it works [mostly] {sometimes}.",
    ],
    "de": [
        "Größenwahnsinnige Straßenbahnfahrer überqueren die Brücke.",
        "Die Donaudampfschifffahrtsgesellschaft fährt heute nicht.",
        "Ich hätte gern ein Stück Käsekuchen, bitte.",
    ],
    "fr": [
        "L'été dernier, nous sommes allés à la plage près de Saint-Malo.",
        "Ça va ? Oui, très bien, merci ! Et toi, qu'est-ce que tu fais ?",
        "« Les naïfs croient que l'œuvre est finie », dit-il.",
    ],
    "es": [
        "¿Dónde está la biblioteca? ¡Está allí, junto al café!",
        "El niño comió ñoquis y pidió más jalapeños.",
    ],
    "pt": ["A ação do coração não é só emoção; é também razão."],
    "it": ["Perché l'università è così lontana? Non lo so, però è bella."],
    "pl": ["Zażółć gęślą jaźń. Chrząszcz brzmi w trzcinie w Szczebrzeszynie."],
    "tr": ["İstanbul'da ılık bir sabah; çay, simit ve güzel bir manzara."],
    "vi": ["Tiếng Việt có nhiều dấu: ắ, ằ, ẳ, ẵ, ặ, và ươ rất đẹp."],
    "ru": [
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Москва — столица России; население около 13 миллионов человек.",
    ],
    "uk": ["Гей, хлопці, ґудзик і їжак — це українські літери."],
    "el": ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!"],
    "ar": ["مرحبا بالعالم! هذه جملة عربية قصيرة للاختبار.", "السَّلَامُ عَلَيْكُمْ وَرَحْمَةُ اللهِ"],
    "he": ["שלום עולם! זהו משפט בעברית לבדיקה."],
    "hi": ["नमस्ते दुनिया! यह हिंदी में एक परीक्षण वाक्य है।", "क्षत्रिय ज्ञान श्रृंगार"],
    "bn": ["আমি বাংলায় গান গাই।"],
    "ta": ["வணக்கம் உலகம்! இது ஒரு சோதனை."],
    "th": ["สวัสดีชาวโลก นี่คือประโยคทดสอบภาษาไทย", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ"],
    "ka": ["გამარჯობა მსოფლიო!"],
    "hy": ["Բարեւ աշխարհ:"],
    "am": ["ሰላም ለዓለም!"],
    "zh": [
        "你好，世界！这是一个用于测试分词器的中文句子。",
        "机器学习模型需要大量的数据来进行训练和评估。",
        "繁體中文與簡體中文都應該被正確地處理。",
        "《红楼梦》是中国古典四大名著之一，作者曹雪芹。",
    ],
    "ja": [
        "こんにちは世界！これはトークナイザーのテストです。",
        "東京タワーは1958年に完成しました。ｶﾀｶﾅ、ＡＢＣ、１２３。",
        "吾輩は猫である。名前はまだ無い。",
    ],
    "ko": [
        "안녕하세요, 세계! 이것은 토크나이저 테스트입니다.",
        "한국어 문장은 띄어쓰기가 있습니다. ㅋㅋㅋ ㅎㅎ",
    ],
}

EMOJI = [
    "🙂", "😀", "🚀", "🔥", "👍", "👍🏽", "🇺🇸", "🇯🇵", "🏳️‍🌈", "👨‍👩‍👧‍👦", "👩🏻‍💻", "🧑‍🚀",
    "❤️", "✨", "🎉", "🤖", "🐍", "🦀", "☕", "⚡", "1️⃣", "#️⃣", "🫠", "🧪", "👁‍🗨", "🏴‍☠️",
]

CODE = [
    'def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n',
    'func main() {\n\tfmt.Println("hello, 世界")\n\tfor i := 0; i < 10; i++ {\n\t\tsum += i\n\t}\n}\n',
    '#include <stdio.h>\n\nint main(void) {\n    printf("%d\\n", 42);\n    return 0;\n}\n',
    'SELECT id, name FROM users WHERE age >= 18 AND name LIKE \'%o%\' ORDER BY id DESC;',
    '{"key": "value", "list": [1, 2.5, -3e10, true, null], "nested": {"a": "b"}}',
    '<div class="box">\n  <p>Hello &amp; welcome!</p>\n</div>',
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}',
    'x = [i**2 for i in range(10) if i % 2 == 0]  # squares\nprint(f"{x=}")',
    '    \t  mixed   \t indentation\t\t\n\n\n   trailing   ',
    '$ ls -la /usr/local/bin | grep -E "^d" && echo "done" || exit 1',
    'if (a && b || !c) { return a->b[0] << 2 >> 1; } // comment /* block */',
    'class Foo:\r\n    pass\r\n',
    '\t\tindented with tabs\n\t\t\tand more tabs\n',
    'const re = /^(?:[a-z0-9!#$%&\'*+/=?^_`{|}~-]+)$/i;',
    '    return self.__dict__.get("_cache", None)\n\n\n\n',
    'a=1;b=2;c=a+b;d=c*2-1;e=d/3;f=e%2;',
    'matrix = [[1, 2, 3],\n          [4, 5, 6],\n          [7, 8, 9]]',
]

SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<s>", "</s>", "<unk>", "<|fim_prefix|>", "<|vision_start|>",
    "<|reserved_special_token_5|>",
    "<mask>", " <mask> ", "a<mask>b", "x <mask>", "<pad>", " <pad> ", "a<pad>b",
    # near misses
    "<|im_start", "im_end|>", "<|endoftext|", "<<|im_end|>>", "<|IM_START|>", "< think>",
]

WORDS = [
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "I", "at", "be", "this", "have", "from", "or", "one", "had",
    "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said",
    "tokenizer", "inference", "engine", "scheduler", "kernel", "attention", "prefill", "decode",
    "Hello", "World", "GPU", "CPU", "HTTP", "JSON", "YAML", "don't", "we're", "they'll", "I'd",
    "I'M", "YOU'LL", "She'S", "it'ſ", "O'Neil", "rock'n'roll", "ma'am", "'tis", "''", "'s",
    "naïve", "café", "façade", "coöperate", "résumé", "Zürich", "ﬁnance", "Ǆemal",
]

RANDOM_BLOCKS = [
    (0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
    (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2190, 0x21FF), (0x2200, 0x22FF),
    (0x2460, 0x24FF), (0x2500, 0x257F), (0x3000, 0x303F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F),
    (0x1F900, 0x1F9FF), (0x1D400, 0x1D7FF), (0x10000, 0x1007F), (0xE000, 0xE0FF),
]

WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\n", "\u00a0", "\u3000",
              "\u2009", "\u200b", "\u2028", "\x0b", "\x0c", "\r", "\u0085", " \t \n \t "]


def rand_number(r):
    k = r.randrange(8)
    if k == 0:
        return str(r.randrange(10))
    if k == 1:
        return str(r.randrange(10 ** r.randrange(1, 20)))
    if k == 2:
        return f"{r.uniform(-1e6, 1e6):.{r.randrange(0, 8)}f}"
    if k == 3:
        return f"{r.randrange(1, 10**9):,}"
    if k == 4:
        return f"{r.random():.3e}"
    if k == 5:
        return "0x" + format(r.randrange(1 << 32), "x")
    if k == 6:
        return "-" + str(r.randrange(1000)) + "." + str(r.randrange(1000))
    return "".join(r.choice("٠١٢٣٤٥٦٧٨٩०१२३४५६७८९①②③ⅣⅫ½¾²³") for _ in range(r.randrange(1, 6)))


def rand_unicode(r, n):
    out = []
    for _ in range(n):
        lo, hi = r.choice(RANDOM_BLOCKS)
        cp = r.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
    return "".join(out)


def rand_ws(r):
    return r.choice(WHITESPACE) * r.randint(1, 3)


def mix(r):
    """A line that mixes several kinds of material."""
    parts = []
    for _ in range(r.randint(1, 8)):
        k = r.randrange(10)
        if k < 3:
            lang = r.choice(list(PROSE))
            parts.append(r.choice(PROSE[lang]))
        elif k == 3:
            parts.append(r.choice(EMOJI) * r.randint(1, 3))
        elif k == 4:
            parts.append(rand_number(r))
        elif k == 5:
            parts.append(r.choice(SPECIALS))
        elif k == 6:
            parts.append(" ".join(r.choice(WORDS) for _ in range(r.randint(1, 12))))
        elif k == 7:
            parts.append(rand_ws(r))
        elif k == 8:
            parts.append(rand_unicode(r, r.randint(1, 12)))
        else:
            parts.append(r.choice(CODE)[: r.randint(5, 120)])
    sep = r.choice(["", " ", " ", " ", "\n", "\t", "  ", ", "])
    return sep.join(parts)


def cases(n, seed=20261129):
    r = random.Random(seed)
    fixed = ["", " ", "  ", "\n", "\n\n\n", "\t", " \t\n ", "\r\n", "   \n   ", "\u3000", "a", "I", "'", "''s",
             "\u200d", "\ufeff", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "e\u0301", "\u00e9",
             "A\u030a", "\u212b", "\uFB01", "\u1e9b\u0323", "한", "\u1112\u1161\u11ab"]
    out = list(fixed)
    for lang, lines in PROSE.items():
        out.extend(lines)
    out.extend(CODE)
    out.extend(SPECIALS)
    out.extend(EMOJI)
    while len(out) < n:
        k = r.randrange(20)
        if k < 10:
            out.append(mix(r))
        elif k < 12:
            out.append(r.choice(CODE))
        elif k < 13:
            out.append(rand_ws(r) + r.choice(WORDS) + rand_ws(r))
        elif k < 14:
            out.append(rand_unicode(r, r.randint(1, 40)))
        elif k < 15:
            out.append(" ".join(rand_number(r) for _ in range(r.randint(1, 6))))
        elif k < 16:
            out.append("".join(r.choice(EMOJI) for _ in range(r.randint(1, 10))))
        elif k < 17:
            out.append(r.choice(SPECIALS) + r.choice(PROSE[r.choice(list(PROSE))]) + r.choice(SPECIALS))
        elif k < 18:
            out.append(r.choice(" \t\n") * r.randint(1, 40))
        elif k < 19:
            # long lines: paragraphs of prose in one language
            lang = r.choice(list(PROSE))
            out.append(" ".join(r.choice(PROSE[lang]) for _ in range(r.randint(2, 10))))
        else:
            out.append(r.choice(WORDS) * r.randint(1, 30))
    return out[:n]


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--lines", type=int, default=12000)
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "testdata", "tokenizer", "corpus.jsonl.gz"))
    a = ap.parse_args()
    lines = cases(a.lines)
    with gzip.GzipFile(a.out, "wb", mtime=0) as f:
        for s in lines:
            f.write((json.dumps(s, ensure_ascii=False) + "\n").encode("utf-8"))
    total = sum(len(s.encode("utf-8")) for s in lines)
    print(f"corpus: {len(lines)} cases, {total} bytes of text -> {a.out}")


if __name__ == "__main__":
    main()
