r"""The instructor's guide (docs/instructor.md) answers every exercise of the walkthrough and gives
every written deliverable of the coursework its expected ranges and a rubric.

Chapters are matched by title, never by number (the book's chapters are renumbered now and then):
a walkthrough chapter `## 7 Medusa` is the guide's `## Medusa`. An exercise is matched by its
number within its chapter's set and its first words: the book's exercise 2 of Medusa, "Build
`MedusaHeads.blocks` as ...", is the guide's `### Exercise 2: Build \`MedusaHeads.blocks\` as ...`.
A deliverable is the guide's `### Deliverable \`NAME\``, NAME a key of `course.CHAPTERS`, under the
title of the chapter that teaches it."""
import re

from tinyspec.commands.cli import WEIGHTS

ROOT = WEIGHTS.parent
FIRST_WORDS = 6  # how many of an exercise's first words identify it
HEADING = re.compile(r"^## (.+)$", re.M)
EXERCISE = re.compile(r"^### Exercise (\d+): (.+)$", re.M)
DELIVERABLE = re.compile(r"^### Deliverable `(\w+)`$", re.M)


def title(heading: str) -> str:
    """A chapter's title without its number: "7 Medusa" -> "Medusa"."""
    return re.sub(r"^\d+\s+", "", heading.strip())


def sections(text: str) -> dict[str, str]:
    """{title: body} for every `## ` section of a Markdown text."""
    found = list(HEADING.finditer(text))
    return {title(m.group(1)): text[m.end():found[i + 1].start() if i + 1 < len(found) else len(text)]
            for i, m in enumerate(found)}


def first_words(text: str) -> str:
    return " ".join(text.split()[:FIRST_WORDS])


def book_exercises(text: str) -> list[tuple[str, int, str]]:
    """(chapter title, number, first words) of every exercise in the walkthrough's exercise sets."""
    out = []
    for name, body in sections(text).items():
        if "\n### Exercises\n" not in body:
            continue
        block = re.split(r"^#{2,3} ", body.split("\n### Exercises\n", 1)[1], flags=re.M)[0]
        for m in re.finditer(r"^(\d+)\. (.+(?:\n(?!\d+\. ).+)*)", block, re.M):
            out.append((name, int(m.group(1)), first_words(m.group(2))))
    return out


def guide_entries(text: str, pattern: re.Pattern) -> dict[tuple, str]:
    """{(chapter title, *the heading's groups): the entry's text} for the guide's `### ` entries."""
    out = {}
    for name, body in sections(text).items():
        found = list(re.finditer(r"^### .+$", body, re.M))
        for i, m in enumerate(found):
            entry = pattern.match(m.group(0))
            if entry:
                out[(name, *entry.groups())] = body[m.end():found[i + 1].start() if i + 1 < len(found) else len(body)]
    return out


def problems(book: str, guide: str, chapters: dict) -> list[str]:
    """What the guide lacks, or holds that the book and the course no longer have."""
    bad = []
    answers = {(name, int(n), first_words(words)): body for (name, n, words), body in guide_entries(guide, EXERCISE).items()}
    asked = book_exercises(book)
    for key in asked:
        body = answers.get(key)
        if body is None:
            bad.append(f"no answer to {key[0]!r}, exercise {key[1]} ({key[2]} ...): add `### Exercise {key[1]}: "
                       f"{key[2]} ...` under `## {key[0]}`")
        elif len(body.split()) < 40:
            bad.append(f"{key[0]!r}, exercise {key[1]}: an answer of {len(body.split())} words is no answer key")
    for key in sorted(set(answers) - set(asked)):
        bad.append(f"the guide answers {key[0]!r}, exercise {key[1]} ({key[2]} ...), which the book no longer has")
    rubrics = guide_entries(guide, DELIVERABLE)
    for name, chapter in chapters.items():
        where = title(chapter.walkthrough)
        body = rubrics.get((where, name))
        if body is None:
            bad.append(f"no rubric for the deliverable {name!r}: add its `### Deliverable` entry under `## {where}`")
            continue
        for part in ("**Expected.**", "**Noise.**", "**Rubric"):
            if part not in body:
                bad.append(f"deliverable {name!r} has no {part} paragraph")
    for where, name in sorted(set(rubrics) - {(title(c.walkthrough), n) for n, c in chapters.items()}):
        bad.append(f"the guide grades deliverable {name!r} under {where!r}, which the course does not hand out there")
    return bad


def texts():
    from tinyspec.course.assignments import CHAPTERS
    return (ROOT / "walkthrough.md").read_text(), (ROOT / "docs" / "instructor.md").read_text(), CHAPTERS


def test_the_guide_answers_every_exercise_and_grades_every_deliverable():
    book, guide, chapters = texts()
    assert len(book_exercises(book)) >= 50, "the walkthrough's exercise sets were not found"
    bad = problems(book, guide, chapters)
    assert not bad, "docs/instructor.md is out of step with the book or the course:\n" + "\n".join(bad)


def test_the_match_survives_renumbering_and_catches_what_is_missing():
    """Renumbered chapters change nothing; a new exercise, an exercise reworded, a chapter renamed and a
    deliverable without a rubric are each reported."""
    book, guide, chapters = texts()
    renumbered = re.sub(r"^## (\d+) ", lambda m: f"## {int(m.group(1)) + 1} ", book, flags=re.M)
    assert problems(renumbered, guide, chapters) == []
    medusa = book.index("\n### Exercises\n", re.search(r"^## \d+ Medusa$", book, re.M).start())
    added = book[:medusa] + "\n### Exercises\n\n99. Measure something new with the heads.\n" + book[medusa + len("\n### Exercises\n"):]
    assert any("exercise 99" in p for p in problems(added, guide, chapters))
    reworded = book.replace("Write `train_bpe_slow(chunk_counts, vocab_size)`", "Write `train_bpe_naive(chunk_counts, vocab_size)`")
    found = problems(reworded, guide, chapters)
    assert any("no answer to 'Tokenizer', exercise 1" in p for p in found) and any("no longer has" in p for p in found)
    renamed = re.sub(r"^## (\d+) Tokenizer$", r"## \1 Tokenisation", book, flags=re.M)
    assert any("'Tokenisation', exercise 1" in p for p in problems(renamed, guide, chapters))
    no_rubric = guide.replace("### Deliverable `kvcache`", "### Deliverable `kvcache` notes")
    assert any("deliverable 'kvcache'" in p for p in problems(book, no_rubric, chapters))
