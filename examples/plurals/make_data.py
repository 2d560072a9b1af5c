"""Write the English-plurals dataset: train.jsonl and heldout.jsonl.

    python examples/plurals/make_data.py [OUT_DIR]      # default: examples/plurals/data

Every row is {"question": ..., "answer": <plural>, "noun": <singular>, "kind": <rule>}. The
nouns come from the tables below, nothing is downloaded, and the output is the same on every
run. About one noun in three of each kind is held out: a held-out noun never appears in
training, in any phrasing, so the held-out score measures pluralising unseen words. Training
has every training noun in every phrasing; the held-out file has each held-out noun once, in a
phrasing picked by a stable hash.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REGULAR = """cat dog book car tree house apple chair table pen girl bird river mountain garden
window door flower teacher student farmer doctor planet star island bridge road ship boat train
rocket computer lamp pillow blanket bottle cup plate spoon fork bowl shoe sock hat coat shirt
button ribbon candle mirror ladder hammer nail rope basket bucket drum guitar violin trumpet song
poem letter word name idea dream friend king queen prince knight castle tower village town street
market shop bank park school office hospital kitchen room wall floor horse cow pig goat rabbit
tiger lion elephant snake frog duck eagle owl whale shark dolphin bee ant spider camel zebra
penguin parrot squirrel turtle lizard bear hen crow pigeon beetle worm snail cloud lake
forest desert ocean valve engine wheel tire cookie movie pie tie toe cake game page note
map clock globe kite balloon puzzle""".split()
SIBILANT = """box fox tax wax glass class dress kiss boss cross address princess witness compass
process church bench beach branch coach couch ditch inch lunch match patch peach pouch punch
sandwich speech torch watch witch wrench brush bush crash dish flash leash marsh rash wish
splash bus gas lens circus virus walrus fax mix""".split()
CONSONANT_Y = """baby city party lady story country berry cherry puppy family body army candy
copy daisy diary duty enemy factory fairy fly spy sky pony library battery bakery dictionary
activity ability memory penny hobby jelly lily lorry navy pastry poppy query ruby strawberry
theory trophy university variety worry colony ferry galaxy injury mystery balcony bunny
butterfly canary category century charity company delivery discovery dragonfly emergency
gallery history jury laundry melody nursery pharmacy policy property quantity remedy salary
secretary society strategy tragedy treaty""".split()
VOWEL_Y = """boy toy key day monkey donkey turkey valley tray ray essay highway journey
chimney jockey trolley alley holiday birthday guy cowboy subway runway kidney pulley attorney
display decoy delay survey""".split()
O_S = "piano photo radio zoo kangaroo video studio rodeo patio kilo memo logo disco casino tattoo"
O_ES = "potato tomato hero echo veto torpedo"
F_S = "roof chief cliff belief chef proof giraffe reef sheriff cuff gulf safe cafe brief"
VES = {"knife": "knives", "wife": "wives", "life": "lives", "leaf": "leaves", "loaf": "loaves",
       "thief": "thieves", "wolf": "wolves", "calf": "calves", "half": "halves",
       "shelf": "shelves", "elf": "elves", "self": "selves", "sheaf": "sheaves"}
IRREGULAR = {"man": "men", "woman": "women", "child": "children", "foot": "feet",
             "tooth": "teeth", "goose": "geese", "mouse": "mice", "louse": "lice", "ox": "oxen",
             "person": "people", "sheep": "sheep", "deer": "deer", "moose": "moose",
             "series": "series", "species": "species", "aircraft": "aircraft",
             "nucleus": "nuclei", "radius": "radii", "stimulus": "stimuli", "alumnus": "alumni",
             "crisis": "crises", "thesis": "theses", "analysis": "analyses", "axis": "axes",
             "oasis": "oases", "phenomenon": "phenomena", "criterion": "criteria",
             "bacterium": "bacteria", "vertex": "vertices", "salmon": "salmon",
             "bison": "bison", "grandchild": "grandchildren", "die": "dice",
             "quiz": "quizzes"}

PHRASINGS = (
    "What is the plural of '{w}'?",
    'Give the plural form of the noun "{w}".',
    "One {w}, two ... what? Write the plural of '{w}'.",
    "How do you write the word '{w}' in the plural?",
    "Plural of {w}?",
    "Change '{w}' into its plural form.",
    "Write the plural of the noun '{w}'.",
)
HELDOUT_SHARE = 3
"""one noun in this many of each kind is held out"""


def plural_table() -> dict[str, tuple[str, str]]:
    """{singular: (plural, kind)} for every noun of the tables above (each noun once)."""
    table: dict[str, tuple[str, str]] = {}

    def add(words, kind, rule):
        for w in words:
            table.setdefault(w, (rule(w), kind))

    add(IRREGULAR, "irregular", IRREGULAR.get)
    add(VES, "f-ves", VES.get)
    add(REGULAR, "s", lambda w: w + "s")
    add(SIBILANT, "es", lambda w: w + "es")
    add(CONSONANT_Y, "y-ies", lambda w: w[:-1] + "ies")
    add(VOWEL_Y, "vowel-y-s", lambda w: w + "s")
    add(O_S.split(), "o-s", lambda w: w + "s")
    add(O_ES.split(), "o-es", lambda w: w + "es")
    add(F_S.split(), "f-s", lambda w: w + "s")
    return table


def _rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_nouns(table: dict[str, tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(training nouns, held-out nouns): per kind, in a stable hash order, every
    HELDOUT_SHARE-th noun is held out."""
    train, held = [], []
    for kind in sorted({k for _, k in table.values()}):
        nouns = sorted((w for w, (_, k) in table.items() if k == kind), key=_rank)
        for i, w in enumerate(nouns):
            (held if i % HELDOUT_SHARE == 0 else train).append(w)
    return sorted(train), sorted(held, key=_rank)


def row(noun: str, phrasing: str, table: dict[str, tuple[str, str]]) -> dict:
    plural, kind = table[noun]
    return {"question": phrasing.format(w=noun), "answer": plural, "noun": noun, "kind": kind}


def build() -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows)."""
    table = plural_table()
    train_nouns, held_nouns = split_nouns(table)
    train = [row(w, p, table) for w in train_nouns for p in PHRASINGS]
    held = [row(w, PHRASINGS[int(_rank("phrasing " + w), 16) % len(PHRASINGS)], table)
            for w in held_nouns]
    return train, held


def write(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent / "data"
    out.mkdir(parents=True, exist_ok=True)
    train, held = build()
    write(train, out / "train.jsonl")
    write(held, out / "heldout.jsonl")
    print(f"{out}: {len(train)} training rows ({len(train) // len(PHRASINGS)} nouns), "
          f"{len(held)} held-out rows (nouns never in training)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
