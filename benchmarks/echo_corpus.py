"""Texts for the input-echoing workload (benchmarks/workloads.py `echo_workload`): prose to fix or
rewrite and code to edit, whose answers copy long spans of the prompt. Written for this project."""

from __future__ import annotations

PROSE = (
    "The library opens at nine in the morning and closes at six in the evening. Visitors can borrow up to five "
    "books at a time, and each loan lasts three weeks. Late returns cost ten cents a day, and lost books must be "
    "paid for at the price printed on the inside cover.",
    "Our team meets every Monday to plan the week. We review the open tasks, decide who takes each one, and "
    "write down the deadlines on the shared board. On Friday afternoon we look at what was finished and what "
    "needs to move to the next week.",
    "To make bread, mix the flour, water, salt and yeast in a large bowl. Knead the dough for ten minutes until it "
    "is smooth, then let it rest in a warm place for an hour. Shape the loaf, let it rise again, and bake it in a "
    "hot oven for about forty minutes.",
    "The river starts in the mountains as a small stream of melted snow. It grows as other streams join it, "
    "passes through three towns and a wide valley of farms, and finally reaches the sea after a journey of more "
    "than two hundred miles.",
    "When you start a new job, take time to learn the names of the people around you. Ask questions when "
    "something is not clear, write down what you learn each day, and do not be afraid to say when you need more "
    "time to finish a task.",
    "The old train station was built more than a century ago and served the town for many decades. After the "
    "line closed, the building stood empty until a group of neighbours turned it into a small museum with a "
    "cafe and a garden.",
    "Regular exercise helps the heart, the lungs and the mind. A walk of thirty minutes a day is enough for many "
    "people to feel better, sleep more deeply and have more energy during the day.",
    "The school garden has beds of carrots, beans, tomatoes and sunflowers. Each class looks after one bed, "
    "waters it twice a week and writes down how tall the plants grow. In the autumn the students cook a meal "
    "with what they have harvested.",
)

CODE = (
    "def total_price(items, tax_rate):\n"
    "    total = 0\n"
    "    for item in items:\n"
    "        total = total + item.price * item.quantity\n"
    "    total = total * (1 + tax_rate)\n"
    "    return round(total, 2)\n",
    "def count_words(text):\n"
    "    counts = {}\n"
    "    for word in text.lower().split():\n"
    "        word = word.strip('.,!?')\n"
    "        if word:\n"
    "            counts[word] = counts.get(word, 0) + 1\n"
    "    return counts\n",
    "class Stack:\n"
    "    def __init__(self):\n"
    "        self.items = []\n"
    "\n"
    "    def push(self, item):\n"
    "        self.items.append(item)\n"
    "\n"
    "    def pop(self):\n"
    "        if not self.items:\n"
    "            raise IndexError('pop from an empty stack')\n"
    "        return self.items.pop()\n",
    "def find_max(numbers):\n"
    "    best = numbers[0]\n"
    "    for number in numbers[1:]:\n"
    "        if number > best:\n"
    "            best = number\n"
    "    return best\n",
)

# (instruction, renamed identifier, new name) for the code edits
CODE_RENAMES = (("total", "amount"), ("counts", "frequencies"), ("items", "elements"), ("best", "largest"))
