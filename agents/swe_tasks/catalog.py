"""The bugs of the toy SWE task set: six families of five, each a correct module plus the one edit that breaks it.

Owns: the data only — for every bug, the module's correct source, the expression the bug replaces
(`right`) and what it writes instead (`wrong`), the symptom a user would report, one visible test
(fails on the bug) and hidden tests (pass only when fixed). `tasks.py` turns these into repositories.
`wrong` is written so that `sed -i 's/<wrong>/<right>/' <file>` fixes the bug (no `/`, `*`, `[`, `\\`, `&`
or quotes that sed or the shell would read differently); the task gate test checks every one.
"""

from __future__ import annotations

from dataclasses import dataclass

TRAIN_FAMILIES = ("operator", "off_by_one", "comparison", "constant")
HELD_OUT_FAMILIES = ("wrong_variable", "string_method")


@dataclass(frozen=True)
class Bug:
    """One seeded bug; `right` occurs exactly once in `source`, `wrong` replaces it."""

    family: str
    package: str  # directory of the module in the repository, e.g. "calc"
    module: str  # file name in the package, e.g. "ops.py"
    function: str  # the function the tests import
    source: str  # the correct module source
    right: str
    wrong: str
    symptom: str  # what a user sees, for the issue text
    visible: str  # one assertion (a statement) that fails on the bug
    hidden: tuple[str, ...]  # assertions that all hold only once the bug is fixed

    @property
    def path(self) -> str:
        return f"{self.package}/{self.module}"

    @property
    def buggy_source(self) -> str:
        return self.source.replace(self.right, self.wrong)


def _bug(family, package, module, function, source, right, wrong, symptom, visible, *hidden) -> Bug:
    return Bug(family, package, module, function, source, right, wrong, symptom, visible, tuple(hidden))


BUGS: tuple[Bug, ...] = (
    # -- operator: the wrong arithmetic operator ------------------------------------------------
    _bug("operator", "calc", "ops.py", "add",
         "def add(a, b):\n    return a + b\n", "return a + b", "return a - b",
         "add(2, 3) returns -1 instead of 5.",
         "self.assertEqual(add(2, 3), 5)",
         "self.assertEqual(add(0, 0), 0)", "self.assertEqual(add(-4, 10), 6)", "self.assertEqual(add(7, 7), 14)"),
    _bug("operator", "geometry", "rect.py", "area",
         "def area(width, height):\n    return width * height\n", "return width * height", "return width + height",
         "area(3, 4) returns 7 instead of 12.",
         "self.assertEqual(area(3, 4), 12)",
         "self.assertEqual(area(2, 2), 4)", "self.assertEqual(area(5, 1), 5)", "self.assertEqual(area(0, 9), 0)"),
    _bug("operator", "money", "price.py", "total",
         "def total(price, quantity):\n    return price * quantity\n", "return price * quantity",
         "return price + quantity",
         "total(10, 3) returns 13 instead of 30.",
         "self.assertEqual(total(10, 3), 30)",
         "self.assertEqual(total(2, 2), 4)", "self.assertEqual(total(7, 0), 0)", "self.assertEqual(total(1, 9), 9)"),
    _bug("operator", "shop", "cart.py", "discounted",
         "def discounted(price, discount):\n    return price - discount\n", "return price - discount",
         "return price + discount",
         "discounted(100, 20) returns 120 instead of 80.",
         "self.assertEqual(discounted(100, 20), 80)",
         "self.assertEqual(discounted(5, 5), 0)", "self.assertEqual(discounted(50, 1), 49)",
         "self.assertEqual(discounted(9, 0), 9)"),
    _bug("operator", "physics", "motion.py", "distance",
         "def distance(speed, time):\n    return speed * time\n", "return speed * time", "return speed - time",
         "distance(6, 2) returns 4 instead of 12.",
         "self.assertEqual(distance(6, 2), 12)",
         "self.assertEqual(distance(3, 3), 9)", "self.assertEqual(distance(10, 0), 0)",
         "self.assertEqual(distance(1, 8), 8)"),
    # -- off_by_one: a bound one too short ------------------------------------------------------
    _bug("off_by_one", "series", "sums.py", "sum_to",
         "def sum_to(n):\n    total = 0\n    for i in range(n + 1):\n        total += i\n    return total\n",
         "range(n + 1)", "range(n)",
         "sum_to(3) returns 3 instead of 6.",
         "self.assertEqual(sum_to(3), 6)",
         "self.assertEqual(sum_to(1), 1)", "self.assertEqual(sum_to(10), 55)", "self.assertEqual(sum_to(0), 0)"),
    _bug("off_by_one", "mathx", "fact.py", "factorial",
         "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
         "range(2, n + 1)", "range(2, n)",
         "factorial(4) returns 6 instead of 24.",
         "self.assertEqual(factorial(4), 24)",
         "self.assertEqual(factorial(1), 1)", "self.assertEqual(factorial(5), 120)",
         "self.assertEqual(factorial(3), 6)"),
    _bug("off_by_one", "timer", "countdown.py", "countdown",
         "def countdown(n):\n    return list(range(n, 0, -1))\n", "range(n, 0, -1)", "range(n, 1, -1)",
         "countdown(3) returns [3, 2] instead of [3, 2, 1].",
         "self.assertEqual(countdown(3), [3, 2, 1])",
         "self.assertEqual(countdown(1), [1])", "self.assertEqual(countdown(0), [])",
         "self.assertEqual(countdown(5), [5, 4, 3, 2, 1])"),
    _bug("off_by_one", "seq", "evens.py", "evens_up_to",
         "def evens_up_to(n):\n    return list(range(0, n + 1, 2))\n", "range(0, n + 1, 2)", "range(0, n, 2)",
         "evens_up_to(4) returns [0, 2] instead of [0, 2, 4].",
         "self.assertEqual(evens_up_to(4), [0, 2, 4])",
         "self.assertEqual(evens_up_to(0), [0])", "self.assertEqual(evens_up_to(5), [0, 2, 4])",
         "self.assertEqual(evens_up_to(2), [0, 2])"),
    _bug("off_by_one", "lists", "index.py", "last_index",
         "def last_index(items):\n    return len(items) - 1\n", "return len(items) - 1", "return len(items)",
         "last_index(['a', 'b']) returns 2 instead of 1.",
         "self.assertEqual(last_index(['a', 'b']), 1)",
         "self.assertEqual(last_index([1]), 0)", "self.assertEqual(last_index([1, 2, 3, 4]), 3)",
         "self.assertEqual(last_index('abc'), 2)"),
    # -- comparison: strict where it should not be (or the reverse) ----------------------------
    _bug("comparison", "people", "age.py", "is_adult",
         "def is_adult(age):\n    return age >= 18\n", "return age >= 18", "return age > 18",
         "is_adult(18) returns False instead of True.",
         "self.assertTrue(is_adult(18))",
         "self.assertTrue(is_adult(40))", "self.assertFalse(is_adult(17))", "self.assertTrue(is_adult(19))"),
    _bug("comparison", "bounds", "check.py", "in_range",
         "def in_range(x, low, high):\n    return low <= x <= high\n", "return low <= x", "return low < x",
         "in_range(1, 1, 5) returns False instead of True.",
         "self.assertTrue(in_range(1, 1, 5))",
         "self.assertTrue(in_range(5, 1, 5))", "self.assertFalse(in_range(0, 1, 5))",
         "self.assertTrue(in_range(3, 1, 5))"),
    _bug("comparison", "grades", "exam.py", "passed",
         "def passed(score):\n    return score >= 50\n", "return score >= 50", "return score > 50",
         "passed(50) returns False instead of True.",
         "self.assertTrue(passed(50))",
         "self.assertTrue(passed(90))", "self.assertFalse(passed(49))", "self.assertFalse(passed(0))"),
    _bug("comparison", "signs", "negative.py", "is_negative",
         "def is_negative(x):\n    return x < 0\n", "return x < 0", "return x <= 0",
         "is_negative(0) returns True instead of False.",
         "self.assertFalse(is_negative(0))",
         "self.assertTrue(is_negative(-1))", "self.assertFalse(is_negative(3))", "self.assertTrue(is_negative(-50))"),
    _bug("comparison", "inventory", "stock.py", "low_stock",
         "def low_stock(count, limit):\n    return count < limit\n", "return count < limit", "return count > limit",
         "low_stock(2, 10) returns False instead of True.",
         "self.assertTrue(low_stock(2, 10))",
         "self.assertFalse(low_stock(20, 10))", "self.assertFalse(low_stock(10, 10))",
         "self.assertTrue(low_stock(0, 1))"),
    # -- constant: a wrong literal --------------------------------------------------------------
    _bug("constant", "mathx", "product.py", "product",
         "def product(numbers):\n    result = 1\n    for n in numbers:\n        result *= n\n    return result\n",
         "result = 1", "result = 0",
         "product([2, 3]) returns 0 instead of 6.",
         "self.assertEqual(product([2, 3]), 6)",
         "self.assertEqual(product([]), 1)", "self.assertEqual(product([5]), 5)",
         "self.assertEqual(product([1, 2, 4]), 8)"),
    _bug("constant", "parity", "even.py", "is_even",
         "def is_even(n):\n    return n % 2 == 0\n", "n % 2 == 0", "n % 2 == 1",
         "is_even(4) returns False instead of True.",
         "self.assertTrue(is_even(4))",
         "self.assertTrue(is_even(0))", "self.assertFalse(is_even(7))", "self.assertTrue(is_even(-2))"),
    _bug("constant", "timeconv", "units.py", "hours_to_minutes",
         "MINUTES_PER_HOUR = 60\n\n\ndef hours_to_minutes(hours):\n    return hours * MINUTES_PER_HOUR\n",
         "MINUTES_PER_HOUR = 60", "MINUTES_PER_HOUR = 100",
         "hours_to_minutes(2) returns 200 instead of 120.",
         "self.assertEqual(hours_to_minutes(2), 120)",
         "self.assertEqual(hours_to_minutes(1), 60)", "self.assertEqual(hours_to_minutes(0), 0)",
         "self.assertEqual(hours_to_minutes(3), 180)"),
    _bug("constant", "retry", "policy.py", "retries",
         "DEFAULT_RETRIES = 3\n\n\n"
         "def retries(custom=None):\n    return DEFAULT_RETRIES if custom is None else custom\n",
         "DEFAULT_RETRIES = 3", "DEFAULT_RETRIES = 0",
         "retries() returns 0 instead of 3.",
         "self.assertEqual(retries(), 3)",
         "self.assertEqual(retries(5), 5)", "self.assertEqual(retries(None), 3)", "self.assertEqual(retries(0), 0)"),
    _bug("constant", "counter", "words.py", "count_words",
         "def count_words(text):\n    count = 0\n    for _ in text.split():\n        count += 1\n    return count\n",
         "count = 0", "count = 1",
         "count_words('a b') returns 3 instead of 2.",
         "self.assertEqual(count_words('a b'), 2)",
         "self.assertEqual(count_words(''), 0)", "self.assertEqual(count_words('one'), 1)",
         "self.assertEqual(count_words('x y z'), 3)"),
    # -- wrong_variable (held out): the other variable ------------------------------------------
    _bug("wrong_variable", "pairs", "first.py", "first",
         "def first(a, b):\n    return a\n", "return a", "return b",
         "first(1, 2) returns 2 instead of 1.",
         "self.assertEqual(first(1, 2), 1)",
         "self.assertEqual(first('x', 'y'), 'x')", "self.assertEqual(first(0, 9), 0)",
         "self.assertEqual(first(5, 5), 5)"),
    _bug("wrong_variable", "compare", "smaller.py", "smaller",
         "def smaller(a, b):\n    return a if a < b else b\n", "return a if a < b", "return b if a < b",
         "smaller(1, 5) returns 5 instead of 1.",
         "self.assertEqual(smaller(1, 5), 1)",
         "self.assertEqual(smaller(5, 1), 1)", "self.assertEqual(smaller(-3, 2), -3)",
         "self.assertEqual(smaller(4, 4), 4)"),
    _bug("wrong_variable", "people", "names.py", "full_name",
         'def full_name(first, last):\n    return first + " " + last\n', 'return first + " " + last',
         'return last + " " + first',
         "full_name('Ada', 'Lovelace') returns 'Lovelace Ada' instead of 'Ada Lovelace'.",
         "self.assertEqual(full_name('Ada', 'Lovelace'), 'Ada Lovelace')",
         "self.assertEqual(full_name('A', 'B'), 'A B')", "self.assertEqual(full_name('x', ''), 'x ')",
         "self.assertEqual(full_name('Alan', 'Turing'), 'Alan Turing')"),
    _bug("wrong_variable", "mathx", "subtract.py", "subtract",
         "def subtract(a, b):\n    return a - b\n", "return a - b", "return b - a",
         "subtract(5, 2) returns -3 instead of 3.",
         "self.assertEqual(subtract(5, 2), 3)",
         "self.assertEqual(subtract(2, 5), -3)", "self.assertEqual(subtract(0, 0), 0)",
         "self.assertEqual(subtract(10, 1), 9)"),
    _bug("wrong_variable", "accounts", "balance.py", "withdraw",
         "def withdraw(balance, amount):\n    return balance - amount\n", "return balance - amount",
         "return amount - balance",
         "withdraw(100, 30) returns -70 instead of 70.",
         "self.assertEqual(withdraw(100, 30), 70)",
         "self.assertEqual(withdraw(50, 50), 0)", "self.assertEqual(withdraw(10, 1), 9)",
         "self.assertEqual(withdraw(3, 4), -1)"),
    # -- string_method (held out): the wrong str method -----------------------------------------
    _bug("string_method", "text", "shout.py", "shout",
         "def shout(s):\n    return s.upper()\n", "return s.upper()", "return s.lower()",
         "shout('hi') returns 'hi' instead of 'HI'.",
         "self.assertEqual(shout('hi'), 'HI')",
         "self.assertEqual(shout('Hey'), 'HEY')", "self.assertEqual(shout(''), '')",
         "self.assertEqual(shout('a1'), 'A1')"),
    _bug("string_method", "text", "clean.py", "clean",
         "def clean(s):\n    return s.strip()\n", "return s.strip()", "return s.lstrip()",
         "clean(' a ') returns 'a ' instead of 'a'.",
         "self.assertEqual(clean(' a '), 'a')",
         "self.assertEqual(clean('b  '), 'b')", "self.assertEqual(clean('c'), 'c')",
         "self.assertEqual(clean('  '), '')"),
    _bug("string_method", "text", "heading.py", "heading",
         "def heading(s):\n    return s.title()\n", "return s.title()", "return s.capitalize()",
         "heading('big news') returns 'Big news' instead of 'Big News'.",
         "self.assertEqual(heading('big news'), 'Big News')",
         "self.assertEqual(heading('a b c'), 'A B C')", "self.assertEqual(heading('one'), 'One')",
         "self.assertEqual(heading('hello world'), 'Hello World')"),
    _bug("string_method", "csvx", "join.py", "to_csv",
         'def to_csv(items):\n    return ",".join(items)\n', 'return ",".join(items)', 'return ";".join(items)',
         "to_csv(['a', 'b']) returns 'a;b' instead of 'a,b'.",
         "self.assertEqual(to_csv(['a', 'b']), 'a,b')",
         "self.assertEqual(to_csv(['x']), 'x')", "self.assertEqual(to_csv([]), '')",
         "self.assertEqual(to_csv(['1', '2', '3']), '1,2,3')"),
    _bug("string_method", "text", "words.py", "words",
         "def words(s):\n    return s.split()\n", "return s.split()", 'return s.split(",")',
         "words('a b') returns ['a b'] instead of ['a', 'b'].",
         "self.assertEqual(words('a b'), ['a', 'b'])",
         "self.assertEqual(words(' x  y '), ['x', 'y'])", "self.assertEqual(words(''), [])",
         "self.assertEqual(words('one'), ['one'])"),
)
