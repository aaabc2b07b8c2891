"""How steady tokens per piece is against tokens per byte, under real vocabularies.

    python bench/pieces.py [--quick]

The meter prices content of a kind a route never counted by its pieces
(``server/routing/content.py``): the tokens a piece cost in the last counted reply times the pieces
the new content holds. That works as far as a piece costs the same in every kind of text, which this
bench measures: for each vocabulary of ``tests/fakes/vocabularies.py`` (Claude's former BPE,
Mistral's tekken, a Llama 2-style SentencePiece model) and each kind of text (prose, code, JSON
compact and indented, CSV, log lines, HTML, Chinese, Japanese, German, base64), the tokens per raw
token (UTF-8 bytes / 4, the baseline: what one ratio per route assumes) and per piece, with numbers
cut as the vocabulary cuts them (told from a CSV sample, as a counted reply tells the meter). Printed
per vocabulary: each kind's two figures and, over the kinds, the spread (max / min) of each. Counts
only: the machine's load changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server.routing.content import GROUPED, Vocabulary, piece_costs, piece_density  # noqa: E402
from tests.fakes.vocabularies import VOCABULARIES  # noqa: E402

WORDS = "the meter shows how full the next request is before it is sent and what a trim leaves".split()


def samples(scale: int) -> dict[str, str]:
    rows = [{"id": n, "name": f"record-{n}", "score": round(n / 7, 3), "active": n % 2 == 0}
            for n in range(scale)]
    return {
        "prose": " ".join(WORDS[(n * 7) % len(WORDS)] + ("." if n % 13 == 12 else "")
                          for n in range(scale * 12)),
        "code": "\n".join(f"def step_{n}(values: list[int]) -> int:\n    return sum(v * {n} for v in values)"
                          for n in range(scale)),
        "json": json.dumps(rows),
        "json, indented": json.dumps({"rows": rows}, indent=2),
        "csv": "\n".join(f"{n},record-{n},{n / 7:.3f},active" for n in range(scale * 2)),
        "log": "\n".join(f"2026-12-02 11:{n % 60:02d}:03 INFO web: GET /api/sessions/{n} 200 1.2ms"
                         for n in range(scale)),
        "html": '<div class="row"><span id="label">Context</span><a href="/s/42">open</a></div>\n' * scale,
        "chinese": "上下文窗口预算令牌估计提供者回复历史修剪路由模型。" * scale,
        "japanese": "これは日本語の文章です。トークンの数を数えます。" * scale,
        "german": "Die Straßenbahn fährt jeden Morgen über die Brücke in die Innenstadt. " * scale,
        "base64": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
                  * scale,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter samples (well under a second)")
    args = parser.parse_args()
    texts = samples(10 if args.quick else 60)
    for name, count in VOCABULARIES.items():
        csv, density = texts["csv"], piece_density([texts["csv"]])
        assert density is not None
        cut = Vocabulary().learned("csv", piece_costs(count(csv), len(csv) / 4, density), density).cut
        numbers = "in groups of up to three" if cut == GROUPED else "digit by digit"
        print(f"\n{name} (numbers cut {numbers})\n")
        print("| text | tokens per raw token | tokens per piece |")
        print("|---|---|---|")
        per_raw, per_piece = {}, {}
        for kind, text in texts.items():
            tokens, raw, sample = count(text), len(text.encode("utf-8")) / 4, piece_density([text])
            assert sample is not None
            per_raw[kind], per_piece[kind] = tokens / raw, tokens / (sample.of(cut) * raw)
            print(f"| {kind} | {per_raw[kind]:.2f} | {per_piece[kind]:.2f} |")
        core = [k for k in texts if k not in ("german", "base64")]
        for label, values in (("all", list(texts)), ("without german and base64", core)):
            spread_raw = max(per_raw[k] for k in values) / min(per_raw[k] for k in values)
            spread_piece = max(per_piece[k] for k in values) / min(per_piece[k] for k in values)
            print(f"| spread, {label} | {spread_raw:.2f}x | {spread_piece:.2f}x |")


if __name__ == "__main__":
    main()
