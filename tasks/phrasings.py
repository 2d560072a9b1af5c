"""Surface forms of the arithmetic problems: many question templates per level.

A template turns one problem (numbers and operation) into a question text. Each level has
`SEEN` templates, the only ones the training stream uses, and `UNSEEN` templates that exist
only in the held-out "unseen" split, so an evaluation there measures transfer to phrasings the
policy never trained on rather than a memorised wording. Forms: bare expressions, imperative
requests, numbers as words, word problems, different answer requests, distractor sentences.

Level 1 and 2 templates render a binary problem ``(a, op, b)``; level 3 templates are two-step
word problems that draw their own numbers. Names and objects in a text are a pure function of
the problem (a stable hash), so a question's text never depends on the process.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from rewards.parsing import words

NAMES = ("Tom", "Mia", "Sam", "Ava", "Leo", "Zoe", "Ben", "Ivy")
ITEMS = ("apples", "marbles", "stickers", "cards", "shells")
def _pick(key: str, options: tuple) -> str:
    digest = hashlib.sha256(key.encode()).digest()
    return options[int.from_bytes(digest[:4], "big") % len(options)]


# ---- binary problems (levels 1 and 2) ------------------------------------------------------
Binary = Callable[[int, str, int], str]
_SYMBOL = {"+": "+", "-": "-", "*": "*"}
_WORD_OP = {"+": "plus", "-": "minus", "*": "times"}


def _name(a, op, b, salt=""):
    return _pick(f"{a}{op}{b}{salt}", NAMES)


def _item(a, op, b):
    return _pick(f"{b}{op}{a}", ITEMS)


def _t_what(a, op, b):
    return f"What is {a} {op} {b}?"


def _t_calc(a, op, b):
    return f"Calculate {a} {op} {b}."


def _t_equals(a, op, b):
    return f"{a} {op} {b} = ?"


def _t_words(a, op, b):
    return f"What is {words(a)} {_WORD_OP[op]} {words(b)}?"


def _t_named(a, op, b):
    return {"+": f"What is the sum of {a} and {b}?",
            "-": f"What is the difference between {a} and {b}?",
            "*": f"What is the product of {a} and {b}?"}[op]


def _t_imperative(a, op, b):
    return {"+": f"Add {a} and {b}.", "-": f"Subtract {b} from {a}.",
            "*": f"Multiply {a} by {b}."}[op]


def _t_variable(a, op, b):
    return f"If x = {a} {op} {b}, what is x?"


def _t_story(a, op, b):
    n, it = _name(a, op, b), _item(a, op, b)
    return {"+": f"{n} has {a} {it} and gets {b} more. How many {it} does {n} have now?",
            "-": f"{n} has {a} {it} and gives away {b}. How many {it} does {n} have left?",
            "*": f"{n} has {b} bags with {a} {it} in each. How many {it} does {n} have?"}[op]


def _t_birds(a, op, b):
    return {"+": f"There are {a} birds on a tree and {b} more land on it. How many birds are "
                 "on the tree?",
            "-": f"There are {a} birds on a tree and {b} fly away. How many birds are still "
                 "on the tree?",
            "*": f"There are {b} trees with {a} birds on each. How many birds are there?"}[op]


def _t_work_out(a, op, b):
    return f"Work out {a} {op} {b} and give the result."


def _t_combine(a, op, b):
    return {"+": f"Combine {a} and {b}. What total do you get?",
            "-": f"Take {b} away from {a}. What is left?",
            "*": f"Take {b} groups of {a}. How many is that altogether?"}[op]


def _t_evaluate(a, op, b):
    return f"Evaluate the expression {a} {op} {b}."


# unseen forms: never trained on
def _u_relative(a, op, b):
    return {"+": f"What number is {b} more than {a}?",
            "-": f"What number is {b} less than {a}?",
            "*": f"What number is {b} times as large as {a}?"}[op]


def _u_distractor(a, op, b):
    n = _name(a, op, b, "d")
    age = 6 + (a + 3 * b) % 7
    return {"+": f"{n} is {age} years old. {n} had {a} coins and found {b} more. How many "
                 f"coins does {n} have?",
            "-": f"{n} is {age} years old. {n} had {a} coins and spent {b}. How many coins "
                 f"does {n} have?",
            "*": f"{n} is {age} years old. {n} saves {a} coins every week for {b} weeks. How "
                 f"many coins did {n} save?"}[op]


def _u_start_with(a, op, b):
    verb = {"+": "Add", "-": "Take away", "*": "Multiply it by"}[op]
    return f"Start with {words(a)}. {verb} {words(b)}. What number do you end up with?"


def _u_result_of(a, op, b):
    return {"+": f"Tell me the result of {b} added to {a}.",
            "-": f"Tell me the result of {b} subtracted from {a}.",
            "*": f"Tell me the result of {a} multiplied by {b}."}[op]


BINARY_SEEN: tuple[Binary, ...] = (_t_what, _t_calc, _t_equals, _t_words, _t_named,
                                   _t_imperative, _t_variable, _t_story, _t_birds, _t_work_out,
                                   _t_combine, _t_evaluate)
BINARY_UNSEEN: tuple[Binary, ...] = (_u_relative, _u_distractor, _u_start_with, _u_result_of)


def binary_text(template: Binary, a: int, op: str, b: int) -> str:
    return template(a, _SYMBOL[op], b)


# ---- two-step word problems (level 3) -------------------------------------------------------
Problem = tuple[str, int]
WordProblem = Callable[[random.Random], Problem]


def _buy_and_give(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, bags, per_bag = rng.randint(2, 30), rng.randint(2, 6), rng.randint(2, 12)
    give = rng.randint(1, start + bags * per_bag)
    return (f"{name} has {start} {item}, buys {bags} bags of {per_bag} {item} each, then gives "
            f"away {give}. How many {item} does {name} have?", start + bags * per_bag - give)


def _reading(rng):
    name = rng.choice(NAMES)
    pages, days, extra = rng.randint(5, 40), rng.randint(2, 9), rng.randint(1, 50)
    return (f"{name} reads {pages} pages a day for {days} days, then reads {extra} more pages. "
            f"How many pages did {name} read in total?", pages * days + extra)


def _pencil_boxes(rng):
    name = rng.choice(NAMES)
    per_box, boxes = rng.randint(4, 24), rng.randint(2, 9)
    lost = rng.randint(1, per_box * boxes)
    return (f"A box holds {per_box} pencils. {name} fills {boxes} boxes and then loses {lost} "
            "pencils. How many pencils are left?", per_box * boxes - lost)


def _pocket_money(rng):
    name = rng.choice(NAMES)
    had = rng.randint(10, 120)
    spent, earned = rng.randint(1, had), rng.randint(1, 60)
    return (f"{name} had {had} dollars, spent {spent} dollars on lunch and then earned "
            f"{earned} dollars. How many dollars does {name} have now?", had - spent + earned)


def _sharing(rng):
    name = rng.choice(NAMES)
    each, friends = rng.randint(2, 15), rng.randint(2, 8)
    eaten = rng.randint(1, each)
    return (f"{name} shares {each * friends} cookies equally among {friends} friends, and each "
            f"friend eats {eaten} of them. How many cookies does each friend have left?",
            each - eaten)


def _chairs(rng):
    rows, per_row = rng.randint(2, 20), rng.randint(3, 15)
    taken = rng.randint(1, rows * per_row)
    return (f"A hall has {rows} rows of {per_row} chairs. {taken} chairs are taken. How many "
            "chairs are free?", rows * per_row - taken)


def _bus(rng):
    start, on, off = rng.randint(5, 40), rng.randint(1, 20), rng.randint(1, 30)
    off = min(off, start + on)
    return (f"A bus leaves with {start} passengers. At the first stop {on} people get on and "
            f"{off} get off. How many passengers are on the bus now?", start + on - off)


def _garden(rng):
    rows, plants = rng.randint(2, 12), rng.randint(3, 15)
    eaten = rng.randint(1, rows * plants)
    return (f"A garden has {rows} rows with {plants} carrots in each row. Rabbits eat {eaten} "
            "carrots. How many carrots are left?", rows * plants - eaten)


def _savings(rng):
    name = rng.choice(NAMES)
    weekly, weeks, gift = rng.randint(2, 20), rng.randint(2, 10), rng.randint(1, 50)
    return (f"{name} saves {weekly} dollars every week for {weeks} weeks and then gets a gift "
            f"of {gift} dollars. How much money does {name} have?", weekly * weeks + gift)


def _bakery(rng):
    trays, per_tray = rng.randint(2, 9), rng.randint(6, 24)
    sold = rng.randint(1, trays * per_tray)
    return (f"A baker makes {trays} trays of {per_tray} muffins and sells {sold} of them. How "
            "many muffins are not sold?", trays * per_tray - sold)


def _train(rng):
    cars, seats, standing = rng.randint(2, 10), rng.randint(10, 60), rng.randint(1, 40)
    return (f"A train has {cars} cars with {seats} seats each. Every seat is taken and "
            f"{standing} more people stand. How many people are on the train?",
            cars * seats + standing)


# unseen forms: never trained on
def _u_fruit_stand(rng):
    crates, per_crate, rotten = rng.randint(2, 9), rng.randint(5, 20), rng.randint(1, 30)
    rotten = min(rotten, crates * per_crate)
    price = rng.randint(2, 9)
    return (f"Oranges cost {price} dollars a bag. A fruit stand gets {crates} crates with "
            f"{per_crate} oranges in each, and {rotten} oranges are rotten. How many good "
            "oranges does the stand have?", crates * per_crate - rotten)


def _u_question_first(rng):
    name = rng.choice(NAMES)
    packs, per_pack, extra = rng.randint(2, 8), rng.randint(3, 12), rng.randint(1, 20)
    return (f"How many bottles of water does {name} have, if {name} buys {packs} packs of "
            f"{per_pack} bottles and already had {extra} bottles?", packs * per_pack + extra)


def _u_word_numbers(rng):
    teams, players, absent = rng.randint(2, 9), rng.randint(3, 11), rng.randint(1, 9)
    absent = min(absent, teams * players)
    return (f"A school has {words(teams)} teams of {words(players)} players. On match day "
            f"{words(absent)} players are sick. How many players can play?",
            teams * players - absent)


def _u_library(rng):
    shelves, books, borrowed = rng.randint(2, 12), rng.randint(5, 30), rng.randint(1, 60)
    borrowed = min(borrowed, shelves * books)
    return (f"Each of the {shelves} shelves in a library holds {books} books. Readers borrow "
            f"{borrowed} books. Find the number of books still on the shelves.",
            shelves * books - borrowed)


WORD_SEEN: tuple[WordProblem, ...] = (_buy_and_give, _reading, _pencil_boxes, _pocket_money,
                                      _sharing, _chairs, _bus, _garden, _savings, _bakery,
                                      _train)
WORD_UNSEEN: tuple[WordProblem, ...] = (_u_fruit_stand, _u_question_first, _u_word_numbers,
                                        _u_library)
