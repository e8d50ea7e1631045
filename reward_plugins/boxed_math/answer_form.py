"""What a boxed answer may hold, read on its text before math-verify sees it (standard library only).

math-verify is built to *find* an answer in free text, so it is lenient where a reward must not be: it drops
trailing ``\\text{..}`` (and, with it, everything from the first ``\\text{`` on), keeps the left side of
``a \\approx b`` and the last side of ``a = b = c``, ignores a numeral's subscript, and when a box does not parse
as a whole it answers from a fragment of it (a ``\\frac{..}{..}`` inside, the last equation). Each of these lets a
box that asserts two answers score as one of them (``\\boxed{3 \\text{ (or 4)}}``, ``\\boxed{4 = 3}``,
``\\boxed{3 \\approx 4}``, ``\\boxed{7 \\\\ \\frac12}``). So a box's content is first read by default-deny rules
(:func:`read_form`), and what they accept is then parsed as a whole, with no fallback (``math_check``):

* **text** (``\\text``, ``\\mbox``, ``\\textbf``, ..., and ``\\mathrm``-like fonts around more than one letter) is
  allowed only as: a connective (``and``, ``or``, ``,``: the answer is then a list, compared as a whole with the
  gold), a percent sign, a text of the gold (its unit, or the whole answer: compared up to case, spacing,
  dots and enclosing parentheses), or, when the gold has no text, a unit of :data:`UNIT_WORDS` (dropped, with
  its exponent). A quantity written inside the text (``\\text{4:30 p.m.}``) is the number outside and the
  unit inside. Any other text (``(or 4)``, ``apples``) refuses the box.
* **commands** only from :data:`MATH_COMMANDS` (whose meaning the parser implements); ``\\\\`` and ``&`` only in
  a matrix environment; no characters outside printable ASCII except a few math symbols.
* **approximations**: the part before ``\\approx`` is the answer; each part after it must be a decimal that the
  answer's value rounds or truncates to (``\\frac13 \\approx 0.33`` yes, ``3 \\approx 4`` no). A name before it
  (``x \\approx 11``) makes the first decimal the answer.
* a **numeral with a subscript** (a base, ``101_2``) only where the gold has a numeral with the same subscript.
* whether a box **restates the question** (``72468 * 55`` where the gold is 3985740) is not decided here, on
  text, but on the parse trees, by :mod:`reward_plugins.boxed_math.value_form` (in ``math_check``).

Equal answers up to ``\\text{}`` wrapping, spacing and case of text are recognized by :func:`answer_key`
without any parsing (``4:30\\text{ p.m.}``, ``\\text{4:30 P.M.}`` and ``4:30 \\text{pm}`` have one key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reward_plugins.boxed_math.boxes import scan_group

#: Commands whose argument is text, not mathematics.
TEXT_COMMANDS = frozenset(
    "text textrm textnormal textbf textit textsf texttt textup textmd textsl textsc mbox hbox emph".split()
)
#: Font commands: around one letter they name a symbol (``\\mathrm{e}``, ``\\mathbb{R}``); around more, a text.
FONT_COMMANDS = frozenset(
    "mathrm mathbf mathit mathsf mathtt mathbb mathcal mathfrak mathscr boldsymbol bm operatorname".split()
)
#: Fonts whose single letter is the letter itself in the key (``\\mathbb``, ``\\mathcal``: a different object).
_PLAIN_FONTS = frozenset("mathrm mathbf mathit mathsf mathtt boldsymbol bm operatorname".split())

#: Commands a box may use: the parser implements each of them (none is skipped or stands for something else).
MATH_COMMANDS = frozenset(
    """
    frac dfrac tfrac cfrac sqrt binom dbinom tbinom choose left right
    cdot times div pm mp ast
    le leq ge geq lt gt ne neq leqslant geqslant equiv in notin subset subseteq supset supseteq
    cup cap setminus emptyset varnothing infty circ degree prime mod
    sin cos tan cot sec csc arcsin arccos arctan arccot arcsec arccsc sinh cosh tanh arsinh arcosh artanh
    arcsinh arccosh arctanh log ln lg exp gcd lcm max min det sum prod int lim to
    lfloor rfloor lceil rceil vert lvert rvert Vert langle rangle lbrace rbrace
    overline bar hat vec tilde dot ddot widehat widetilde
    alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi pi varpi rho
    varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi
    Psi Omega
    displaystyle textstyle quad qquad begin end approx thickapprox
    """.split()
)
#: One-character commands a box may use: spacing, escaped braces, percent and dollar signs.
_SYMBOL_COMMANDS = frozenset(",;:! {}%$")
_MATRIX_ENVIRONMENTS = frozenset("matrix pmatrix bmatrix Bmatrix vmatrix Vmatrix smallmatrix array".split())
#: Characters outside printable ASCII that a box may use (the parser reads each as one math symbol).
_UNICODE_SYMBOLS = frozenset("π∞−×÷≤≥≠√≈")

#: Units that may follow a number when the gold gives none (singular and plural; several words: each one).
UNIT_WORDS = frozenset(
    """
    mm cm m km in inch inches ft foot feet yd yard yards mi mile miles meter meters metre metres
    centimeter centimeters centimetre centimetres millimeter millimeters kilometer kilometers kilometre kilometres
    mg g gram grams kg kilogram kilograms lb lbs pound pounds oz ounce ounces ton tons tonne tonnes
    ms s sec secs second seconds min mins minute minutes h hr hrs hour hours day days week weeks month months
    year years yr yrs mph kph kmh
    ml l liter liters litre litres milliliter milliliters gallon gallons gal quart quarts pint pints cup cups
    dollar dollars cent cents yuan euro euros yen rupee rupees
    degree degrees deg radian radians rad ° unit units sq square cubic cu per
    """.split()
)
_CONNECTIVES = frozenset({"and", "or", ",", ",and", ",or", ";"})
_PERCENT_WORDS = frozenset({"%", "percent", "percentage", "pct"})

_TEXT_RE = re.compile(r"\\([A-Za-z]+)(?![A-Za-z])\s*")
_COMMAND_RE = re.compile(r"\\([A-Za-z]+|.)")
_QUANTITY_RE = re.compile(r"(-?\d[\d,:.]*)\s*(.*)", re.DOTALL)
_TEXT_CHARS_RE = re.compile(r"^[A-Za-z0-9\s.,:;'()/%°\-]*$")
_UNIT_TEXT_RE = re.compile(r"^[a-z°][a-z°\s./-]*$")
_APPROX_RE = re.compile(r"\\approx(?![A-Za-z])|\\thickapprox(?![A-Za-z])|≈|~=")
_DECIMAL_RE = re.compile(r"^-?\d+(?:\.\d+)?$")
_NUMERAL_SUBSCRIPT_RE = re.compile(r"\d\s*_\s*")
#: The exponent of a dropped unit (``\\text{cm}^2``), dropped with it.
_EXPONENT_RE = re.compile(r"^\s*\^\s*(?:\{\s*[23]\s*\}|[23])")
_LETTER_DOT_RE = re.compile(r"(?<=[a-z])\.")
_DOUBLED_BACKSLASH_RE = re.compile(r"\\\\(?=[A-Za-z])")
_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_PERCENT_RE = re.compile(r"(?<!\\)%")
_FONT_SYMBOL_RE = re.compile(r"\{[A-Za-z]\}")
_ADJACENT_DIGITS_RE = re.compile(r"(?<=[\d})\]])((?:\s|\\[,;: ]|\\q?quad(?![A-Za-z])|~)+)(?=\d)")
_THOUSANDS_SEPARATOR_RE = re.compile(r"\s*(?:\\[,; ]|~|\s)\s*")
_THREE_DIGITS_RE = re.compile(r"\d{3}(?!\d)")


def canonical_text(text: str) -> str:
    """A text as compared: lower case, no spacing, no dot after a letter (``p.m.``), no enclosing ``(..)``."""
    s = _LETTER_DOT_RE.sub("", text.lower().replace("~", " "))
    s = re.sub(r"\s+", "", s)
    if len(s) >= 2 and s[0] == "(" and s[-1] == ")":
        s = s[1:-1]
    return s


@dataclass(frozen=True)
class _Piece:
    kind: str  # "math" | "text" | "symbol": a one-letter font command, kept as mathematics
    value: str
    font: str = ""


def _pieces(content: str) -> list[_Piece] | None:
    """``content`` cut into mathematics and the arguments of text/font commands; ``None`` if one is malformed."""
    pieces, pos = [], 0
    for m in _TEXT_RE.finditer(content):
        if m.start() < pos:
            continue
        name = m.group(1)
        if name not in TEXT_COMMANDS and name not in FONT_COMMANDS:
            continue
        if m.end() >= len(content) or content[m.end()] != "{":
            return None  # \text 3: an argument without braces
        text, end, _ = scan_group(content, m.end(), len(content))
        if text is None:
            return None
        pieces.append(_Piece("math", content[pos : m.start()]))
        if name in FONT_COMMANDS and re.fullmatch(r"\s*[A-Za-z]\s*", text):
            pieces.append(_Piece("symbol", text.strip(), name))
        else:
            pieces.append(_Piece("text", text, name))
        pos = end
    pieces.append(_Piece("math", content[pos:]))
    return [p for p in pieces if p.value]


def _quantity(text: str) -> tuple[str, str]:
    """A text that starts with a number (``4:30 p.m.``): (the number, the rest); else ("", the text)."""
    m = _QUANTITY_RE.fullmatch(text.strip())
    if m and m.group(2) and re.search(r"[A-Za-z]", m.group(2)):
        return m.group(1), m.group(2)
    return "", text


def answer_key(content: str) -> str:
    """A normal form of an answer's text: two answers with the same key are the same answer.

    Spacing, ``\\dfrac``/``\\tfrac``, ``\\left``/``\\right``, trailing punctuation and one enclosing ``{..}`` are
    ignored; text (``\\text``, ``\\mbox``, ...) is compared by :func:`canonical_text`, with a leading number
    moved out of it (``\\text{4:30 p.m.}`` is ``4:30\\text{pm}``). Also de-duplicates a completion's boxes.
    """
    pieces = _pieces(content)
    if pieces is None:
        pieces = [_Piece("math", content)]
    out = []
    for piece in pieces:
        if piece.kind == "math":
            out.append(piece.value)
        elif piece.kind == "symbol":
            letter = piece.value
            out.append(letter if piece.font in _PLAIN_FONTS else f"\\{piece.font}{{{letter}}}")
        else:
            number, rest = _quantity(piece.value)
            text = canonical_text(rest)
            out.append(number + (f"\\text{{{text}}}" if text else ""))
    s = re.sub(r"\s+|(?<!\\)\$", "", "".join(out))
    s = re.sub(r"\\[dtc]frac", r"\\frac", s).replace("\\left", "").replace("\\right", "")
    s = s.rstrip(".,;")
    if s.startswith("{") and s.endswith("}") and scan_group(s, 0, len(s))[1] == len(s):
        s = s[1:-1]
    return s


@dataclass(frozen=True)
class GoldText:
    """What the form rules need to know about the gold."""

    texts: frozenset[str]  # canonical texts of the gold (its units, or a text answer), connectives left out
    bases: frozenset[str]  # subscripts written on the gold's numerals


def _subscripts(math: str) -> set[str] | None:
    """The subscripts written on numerals (``101_2``, ``12_{10}``), spacing removed; ``None`` if malformed."""
    found = set()
    for m in _NUMERAL_SUBSCRIPT_RE.finditer(math):
        i = m.end()
        if i < len(math) and math[i] == "{":
            group, end, _ = scan_group(math, i, len(math))
            if group is None:
                return None
        else:
            command = _COMMAND_RE.match(math, i)
            end = command.end() if command else i + 1
        found.add(re.sub(r"\s+", "", math[i:end]).removeprefix("{").removesuffix("}"))
    return found


def gold_text(gold: str) -> GoldText:
    pieces = _pieces(gold) or [_Piece("math", gold)]
    texts = set()
    for piece in pieces:
        if piece.kind == "text":
            text = canonical_text(_quantity(piece.value)[1])
            if text and text not in _CONNECTIVES and text not in _PERCENT_WORDS:
                texts.add(text)
    math = "".join(p.value for p in pieces if p.kind == "math")
    return GoldText(frozenset(texts), frozenset(_subscripts(math) or ()))


@dataclass(frozen=True)
class Form:
    """A box's content as the checker reads it: ``exact`` (LaTeX, parsed as a whole) and the decimals written
    after ``\\approx``; or ``refused``: why the box scores 0 unread (``"hedged"``: it holds a second number or a
    second answer; ``"unparsed"``: something the rules do not read)."""

    exact: str = ""
    approx: tuple[str, ...] = ()
    refused: str = ""


def _is_unit(text: str) -> bool:
    if not _UNIT_TEXT_RE.match(text):
        return False
    words = [w for w in re.split(r"[\s./-]+", text) if w]
    return bool(words) and all(w in UNIT_WORDS for w in words)


def _text_as_math(text: str, gold: GoldText) -> str | None:
    """What a text stands for in the answer: "" (dropped), ``,`` or ``\\%``; ``None``: not allowed."""
    canon = canonical_text(text)
    if not canon:
        return ""
    if canon in _CONNECTIVES:
        return " , "
    if canon in _PERCENT_WORDS:
        return "\\%"
    if canon in gold.texts:
        return ""
    if not gold.texts and _is_unit(text.strip().lower()):
        return ""
    if re.fullmatch(r"[a-z]", canon):  # a choice, (B): the letter
        return text.strip("() \t\n")
    return None


def _trailing_words(math: str) -> int | None:
    """Where the words of two letters or more that end ``math`` begin (``5 square feet``), after a numeral, a
    brace or a space; ``None`` if there are none. (A scan from the end: linear, where a regex backtracks.)"""
    i, start = len(math.rstrip()), None
    while True:
        j = i
        while j > 0 and math[j - 1].isascii() and math[j - 1].isalpha():
            j -= 1
        if i - j < 2 or j == 0:
            return start
        if math[j - 1].isdigit() or math[j - 1] in "}" or math[j - 1].isspace():
            start = j
        if not math[j - 1].isspace():
            return start
        i = len(math[:j].rstrip())


def _environments_allowed(math: str) -> bool:
    environments = re.findall(r"\\(?:begin|end)\s*\{([^{}]*)\}", math)
    if any(env.strip() not in _MATRIX_ENVIRONMENTS for env in environments):
        return False
    if len(re.findall(r"\\(?:begin|end)(?![A-Za-z])", math)) != len(environments):
        return False  # \begin without a braced name
    if ("\\\\" in math or "&" in math) and not environments:
        return False  # rows and columns outside a matrix
    return True


def _commands_allowed(math: str) -> bool:
    for m in _COMMAND_RE.finditer(math):
        name = m.group(1)
        if name == "\\":  # a matrix row break (checked by _environments_allowed)
            continue
        if name in FONT_COMMANDS and _FONT_SYMBOL_RE.match(math, m.end()):  # \mathrm{e}, \mathbb{R}
            continue
        if len(name) == 1 and not name.isalpha():
            if name not in _SYMBOL_COMMANDS:
                return False
        elif name not in MATH_COMMANDS:
            return False
    return all(c.isascii() and (c.isprintable() or c in "\t\n") or c in _UNICODE_SYMBOLS for c in math)


def _join_digit_groups(math: str) -> str | None:
    """A numeral after a value (a numeral, a closing brace or bracket) with only spacing between them: a
    thousands grouping (``1\\,234\\,567``, groups of three digits) is one number; anything else (``3 \\; 0``,
    ``\\frac{5}{2} \\quad 1``, which the parser reads as a product, and a reader as two numbers) asserts two
    values: ``None``."""
    out, pos = [], 0
    for m in _ADJACENT_DIGITS_RE.finditer(math):
        separator = m.group(1)
        grouping = math[m.start(1) - 1].isdigit() and _THOUSANDS_SEPARATOR_RE.fullmatch(separator)
        if not grouping or not _THREE_DIGITS_RE.match(math, m.end()):
            return None
        out.append(math[pos : m.start(1)])
        pos = m.end()
    out.append(math[pos:])
    return "".join(out)


def _top_level_split(math: str, pattern: re.Pattern) -> list[str]:
    """``math`` split at the matches of ``pattern`` outside any brace group."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(math):
        c = math[i]
        if c == "\\" and i + 1 < len(math) and math[i + 1] in "{}":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            m = pattern.match(math, i)
            if m and m.end() > i:
                parts.append(math[start:i])
                start = i = m.end()
                continue
        i += 1
    parts.append(math[start:])
    return parts


def read_form(content: str, gold: GoldText) -> Form:
    """The rules of the module docstring applied to one box's content (boxes inside it already unwrapped)."""
    if "matrix" not in content:  # as math-verify does: a doubled backslash before a command name is one
        content = _DOUBLED_BACKSLASH_RE.sub(r"\\", content)
    pieces = _pieces(content)
    if pieces is None:
        return Form(refused="unparsed")
    math, dropped_unit = "", False
    for piece in pieces:
        if piece.kind == "math":
            math += _EXPONENT_RE.sub("", piece.value, count=1) if dropped_unit else piece.value
            dropped_unit = False
        elif piece.kind == "symbol":
            math += f"\\{piece.font}{{{piece.value}}}"
            dropped_unit = False
        else:
            number, rest = _quantity(piece.value)
            replacement = _text_as_math(rest, gold) if _TEXT_CHARS_RE.match(piece.value) else None
            if replacement is None:  # a text that is not part of the answer; with a number beside another: hedging
                return Form(refused="hedged" if re.search(r"\d", rest) and len(pieces) > 1 else "unparsed")
            math += f" {number}{replacement} "
            dropped_unit = replacement == ""
    math = _DOLLAR_RE.sub(" ", math)  # math delimiters inside the box
    math = "\\%".join(part.rstrip() for part in _PERCENT_RE.split(math))  # 28 %: a percent sign, not a comment
    math = re.sub(r",(?:\s*,)+", ",", math)  # 19, 46, \text{and} 82: the connective after a comma adds nothing
    start = _trailing_words(math)
    if start is not None and math[:start].strip() and _text_as_math(math[start:], gold) == "":
        math = math[:start]  # 5 feet: a unit written without \text
    math = _join_digit_groups(math)
    if math is None:
        return Form(refused="hedged")
    if not _environments_allowed(math) or not _commands_allowed(math):
        return Form(refused="unparsed")
    subscripts = _subscripts(math)
    if subscripts is None or not subscripts <= gold.bases:
        return Form(refused="unparsed")
    exact, *approx = _top_level_split(math, _APPROX_RE)
    approx = [re.sub(r"\s+|\\[,;:! ]", "", a) for a in approx]
    if not exact.strip() or not all(_DECIMAL_RE.match(a) for a in approx):
        return Form(refused="unparsed")
    return Form(exact=exact.strip(), approx=tuple(approx))
