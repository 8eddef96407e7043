"""The words the demo's requests are made of: questions, system prompts, agent tasks and tools, document
sentences. Kept apart from workload.py so the plan's logic reads on one screen; plain data, no I/O.

Questions are short and general, the kind a 135M-parameter chat model answers sensibly; agent tasks
each need one of TOOLS, so a request can offer the right tool next to a wrong one.
"""

from __future__ import annotations

from collections.abc import Mapping

TENANTS = ("acme", "globex", "initech")

QUESTIONS = (
    "Why is the sky blue?",
    "What is photosynthesis?",
    "How many legs does a spider have?",
    "What is the largest ocean on Earth?",
    "Give me a tip for sleeping better.",
    "What does a compiler do?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
    "Suggest a name for a friendly robot.",
    "Why do leaves change colour in autumn?",
    "What is a prime number?",
    "How do bees make honey?",
    "What should I pack for a day at the beach?",
    "Explain what a GPU is in one sentence.",
    "What is the tallest mountain in the world?",
    "How can I learn to cook?",
)

SYSTEM_PROMPTS = (
    "You are a concise assistant. Answer in one or two sentences.",
    "You are a friendly tutor for children.",
    "You are a helpful assistant. Be brief.",
)

# (first question, the assistant's earlier answer, the follow-up): a second turn of a conversation.
FOLLOW_UPS = (
    ("Name a fruit.", "An apple.", "What colour is it?"),
    ("What is the capital of Italy?", "The capital of Italy is Rome.", "What is it famous for?"),
    ("Recommend a book.", "Try 'The Hobbit' by J. R. R. Tolkien.", "What is it about?"),
    ("What is a planet?", "A large body that orbits a star.", "Which planet is the largest?"),
)

# name -> (description, {parameter: description}); every parameter is a required string.
TOOLS: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "get_weather": ("Get the current weather for a city.", {"city": "the city, e.g. Lisbon"}),
    "search": ("Search the web and return the top results.", {"query": "what to search for"}),
    "get_time": ("Get the current local time in a time zone.", {"timezone": "an IANA zone, e.g. Asia/Tokyo"}),
    "send_email": (
        "Send an email.",
        {"to": "the recipient's address", "subject": "the subject line", "body": "the message"},
    ),
}

# (task, the tool it needs)
AGENT_TASKS = (
    ("What's the weather like in Lisbon right now?", "get_weather"),
    ("Is it raining in Oslo?", "get_weather"),
    ("Find the opening hours of the Louvre.", "search"),
    ("Look up who won the 2018 World Cup.", "search"),
    ("What time is it in Tokyo?", "get_time"),
    ("Email bob@example.com that the meeting moved to 3 pm.", "send_email"),
)

DOCUMENT_SENTENCES = (
    "The committee met to discuss the budget for the coming year.",
    "Several members argued that the library needed new books.",
    "Others wanted to repair the old bridge over the river.",
    "After a long debate they agreed to do both.",
    "The people of the town went fishing every morning.",
    "The children played on the beach and built castles of sand.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The boiling point falls as you climb, because the air pressure is lower.",
    "A serving engine batches requests so that the GPU stays busy.",
    "When memory runs short, the scheduler pauses the least urgent request.",
)
