"""Thirty short, varied chat prompts (facts, arithmetic, code, writing, advice, translation) for
quality checks that compare two runs of the same model: tests/model/test_int8_quality.py runs
them with the chat template applied, greedy, in bf16 and with --quantization int8."""

from __future__ import annotations

CHAT_PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "How many days are there in a leap year?",
    "Write a haiku about autumn leaves.",
    "Explain what photosynthesis is in one sentence.",
    "What is 12 times 7?",
    "Write a Python function that returns the square of a number.",
    "Give me two tips for sleeping better.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "Describe a cat to someone who has never seen one.",
    "List the planets of the solar system in order.",
    "What does a CPU do in a computer?",
    "Suggest a name for a small coffee shop.",
    "Why is the sky blue?",
    "Write a short thank-you note to a teacher.",
    "What is the largest ocean on Earth?",
    "How do I make a cup of tea?",
    "What is the difference between weather and climate?",
    "Tell me a fun fact about octopuses.",
    "Summarize the story of Cinderella in two sentences.",
    "What is the opposite of 'ancient'?",
    "Give an example of a renewable energy source.",
    "How many legs does a spider have?",
    "Write a SQL query that counts the rows of a table named users.",
    "What should I pack for a day at the beach?",
    "Explain gravity to a five-year-old.",
    "What is the square root of 81?",
    "Recommend a good habit for staying healthy.",
)
