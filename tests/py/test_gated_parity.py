"""One table decides which activations are gated (moe.md §1.3): every place that sizes or
reads FC1 must agree with it, or a loader pads/truncates FC1 silently.

What this test enforces over src/ (C, headers, CUDA):
 1. The table in src/moe/activation.c (act_gated[]) is exactly the set moe.md names:
    {Swiglu, Geglu, SwigluBias, SiTU}.
 2. No other file keeps its own gated set: an expression joining two or more gated
    enumerators with || / &&, or two or more gated enumerators as fall-through case labels,
    is a private copy of the table.
 3. Every file that reads w3 (".w3" / "->w3") or sizes FC1 (an identifier containing "fc1"
    or "w13"/"w3_w1"/"w31") asks the table: it calls k3_act_is_gated or k3_act_fc1_rows.
The checkers are also run on planted violations, so this test can fail.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
TABLE_FILE = SRC / "moe" / "activation.c"
SPEC_GATED = {"K3_ACT_SWIGLU", "K3_ACT_GEGLU", "K3_ACT_SWIGLU_BIAS", "K3_ACT_SITU"}
GATED_RE = r"K3_ACT_(?:SWIGLU_BIAS|SWIGLU|GEGLU|SITU)\b"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_table(text):
    m = re.search(r"act_gated\s*\[\s*K3_ACT_COUNT\s*\]\s*=\s*\{(.*?)\};", strip_comments(text), re.S)
    assert m, "act_gated[K3_ACT_COUNT] initializer not found in activation.c"
    return {name for name, val in re.findall(r"\[\s*(K3_ACT_\w+)\s*\]\s*=\s*(\w+)", m.group(1))
            if val == "true"}


def private_sets(text):
    """Spots of `text` that hand-roll a gated set (rule 2)."""
    text = strip_comments(text)
    found = []
    for expr in re.split(r"[;{}]", text):
        if len(set(re.findall(GATED_RE, expr))) >= 2 and re.search(r"\|\||&&", expr):
            found.append(" ".join(expr.split())[:120])
    run = r"(?:case\s+" + GATED_RE + r"\s*:\s*){2,}"
    found += [" ".join(m.group(0).split()) for m in re.finditer(run, text)]
    return found


def reads_fc1(text):
    text = strip_comments(text)
    return bool(re.search(r"(?:\.|->)w3\b", text) or
                re.search(r"\b\w*(?:fc1|FC1|w13|w3_w1|w31)\w*\b", text))


def asks_table(text):
    return bool(re.search(r"\bk3_act_(?:is_gated|fc1_rows)\s*\(", strip_comments(text)))


def sources():
    return sorted(p for p in SRC.rglob("*") if p.suffix in (".c", ".h", ".cu", ".cuh"))


def test_table_is_the_spec_set():
    assert parse_table(TABLE_FILE.read_text()) == SPEC_GATED


def test_no_private_gated_sets():
    bad = []
    for p in sources():
        if p == TABLE_FILE:
            continue
        bad += [f"{p.relative_to(ROOT)}: {s}" for s in private_sets(p.read_text())]
    assert not bad, "gated set outside activation.c:\n" + "\n".join(bad)


# Known violations waiting for their owner's fix, each with the reason. An entry that no
# longer violates fails the test too, so the list cannot outlive the fix.
PENDING = {}


def test_fc1_readers_ask_the_table():
    bad, fixed = [], []
    for p in sources():
        if p in (TABLE_FILE, SRC / "moe" / "activation.h"):
            continue
        t = p.read_text()
        rel = str(p.relative_to(ROOT))
        violates = reads_fc1(t) and not asks_table(t)
        if violates and rel not in PENDING:
            bad.append(rel)
        if not violates and rel in PENDING:
            fixed.append(rel)
    assert not bad, ("files that read w3 / size FC1 without k3_act_is_gated or "
                     "k3_act_fc1_rows:\n" + "\n".join(bad))
    assert not fixed, "fixed: remove from PENDING: " + ", ".join(fixed)


def test_reference_asks_the_table():
    # the float64 reference must be one of the places the rule covers
    t = (SRC / "moe" / "reference.c").read_text()
    assert reads_fc1(t) and asks_table(t)


def test_checkers_catch_planted_violations():
    assert private_sets("bool g = a == K3_ACT_SWIGLU || a == K3_ACT_SITU;")
    assert private_sets("switch (a) { case K3_ACT_GEGLU: case K3_ACT_SWIGLU_BIAS: return 1; }")
    assert not private_sets("switch (a) { case K3_ACT_SITU: return situ(g, u); }")
    assert not private_sets("/* K3_ACT_SWIGLU || K3_ACT_SITU */ int x;")
    assert reads_fc1("int64_t fc1_rows = 2 * inter;") and not asks_table("int64_t fc1_rows = 2 * inter;")
    assert reads_fc1("q = &e->w3;")
    assert asks_table("n = k3_act_fc1_rows(act, I);")
    table = "static const bool act_gated[K3_ACT_COUNT] = {[K3_ACT_SWIGLU] = true, [K3_ACT_SITU] = true};"
    assert parse_table(table) != SPEC_GATED
