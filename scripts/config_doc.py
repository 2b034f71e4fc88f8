"""Write the table of config keys into docs/config.md (between its two markers), from the one
table the trainer reads (tilesplat.train.config.keys_markdown); tests/test_train_config.py
checks that the page holds it.

    .venv/bin/python scripts/config_doc.py
"""

from pathlib import Path

import tilesplat.train  # noqa: F401  (registers every room's keys)
from tilesplat.train.config import keys_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"
BEGIN, END = "<!-- keys: begin -->", "<!-- keys: end -->"

text = PAGE.read_text()
head, rest = text.split(BEGIN, 1)
_, tail = rest.split(END, 1)
PAGE.write_text(f"{head}{BEGIN}\n{keys_markdown()}\n{END}{tail}")
print(f"wrote {PAGE}")
