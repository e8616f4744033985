"""``data.prompts=stdlib-chat``: chat prompts written from the standard library's own documentation.

A real instruction-tuned target needs instructions, and a prompt set that is on every machine
without a download: questions about the standard library's modules and functions, then (past the 1,516 of
those) its classes and their methods, written from their docstrings (read with :mod:`ast`, nothing is
imported). Each record is
``{"messages": [{"role": "user", "content": ...}]}``, so the target's own chat template renders
it (``data.messages_field``, the default ``messages``). The set is deterministic for a seed;
held-out prompts are chosen by text hash as for any prompt file.

With ``data.demo_scored=N`` the file also holds N conversations whose answer is given: passages of
the language reference that every Python ships (:mod:`pydoc_data.topics`, what ``help("if")``
prints) as the assistant's turn after a question naming the topic. Under ``data.responses=auto`` the
target scores those answers (one teacher-forced forward each, prefill speed) instead of writing
them (decode speed), so a fixed datagen budget sees several times more of the target's
distributions (issue 19).
"""

from __future__ import annotations

import ast
import json
import random
import re
import textwrap
import sysconfig
from pathlib import Path

from draftsmith.artifacts import write_text

STDLIB_CHAT = "stdlib-chat"  # the data.prompts value

MODULE_TEMPLATES = (
    "What is the Python standard-library module `{name}` for? Its documentation begins:\n\n{doc}\n\n"
    "Explain it in a few sentences.",
    "Summarize in plain words what the `{name}` module provides, based on this excerpt of its docstring:\n\n{doc}",
)
FUNCTION_TEMPLATES = (
    "Explain what the Python function `{name}{signature}` does. Its docstring says:\n\n{doc}",
    "Show a short example of calling `{name}{signature}` and say what it returns. Docstring:\n\n{doc}",
    "When would I use `{name}` in Python? Here is its documentation:\n\n{doc}",
)
CLASS_TEMPLATES = (
    "What is the Python class `{name}` for? Its docstring says:\n\n{doc}\n\nExplain it in a few sentences.",
    "Show a short example of using `{name}` and say what it is for. Docstring:\n\n{doc}",
)
TEMPLATES = {"module": MODULE_TEMPLATES, "function": FUNCTION_TEMPLATES, "class": CLASS_TEMPLATES,
             "method": FUNCTION_TEMPLATES}


def _first_paragraph(doc: str, limit: int = 400) -> str:
    para = doc.strip().split("\n\n")[0].strip()
    return para if len(para) <= limit else para[:limit].rsplit(" ", 1)[0] + " ..."


def _signature(node: ast.FunctionDef) -> str:
    try:
        return "(" + ast.unparse(node.args) + ")"
    except Exception:  # noqa: BLE001 - an odd signature only loses its text
        return "(...)"


def _documented(node) -> str | None:
    """The first paragraph of `node`'s docstring when it says something (over 40 characters), else None."""
    doc = ast.get_docstring(node)
    return _first_paragraph(doc) if doc and len(doc) > 40 else None


def documented_items(files: list[Path], root: Path, classes: bool = False) -> list[tuple[str, str, str, str]]:
    """(kind, dotted name, signature, first docstring paragraph) of each documented module and public function;
    with `classes`, of each documented public class and public method instead."""
    items = []
    for path in files:
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        if any(part.startswith("_") for part in module.split(".")):  # private modules, __main__
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        if classes:
            items += _class_items(tree, module)
            continue
        if (doc := _documented(tree)) is not None:
            items.append(("module", module, "", doc))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and (doc := _documented(node)):
                items.append(("function", f"{module}.{node.name}", _signature(node), doc))
    return items


def _class_items(tree: ast.Module, module: str) -> list[tuple[str, str, str, str]]:
    """:func:`documented_items`' classes and methods of one module."""
    items = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        if (doc := _documented(node)) is not None:
            items.append(("class", f"{module}.{node.name}", "", doc))
        for member in node.body:
            if isinstance(member, ast.FunctionDef) and not member.name.startswith("_") and (doc := _documented(member)):
                items.append(("method", f"{module}.{node.name}.{member.name}", _signature(member), doc))
    return items


def stdlib_chat_records(n: int, seed: int = 0) -> list[dict]:
    """`n` chat prompt records about the standard library (fewer only if it documents fewer items): its modules and
    module-level functions first (1,516 on CPython 3.11), shuffled, then its public classes and their methods
    (3,456 more), shuffled apart — so the first records are the same whatever `n`, and a larger `n` only adds."""
    from draftsmith.demo import stdlib_files

    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    rng = random.Random(seed)
    records: list[dict] = []
    for classes in (False, True):
        if len(records) >= n:
            break
        items = documented_items(files, root, classes=classes)
        rng.shuffle(items)
        for kind, name, signature, doc in items[: n - len(records)]:
            text = rng.choice(TEMPLATES[kind]).format(name=name, signature=signature, doc=doc)
            records.append({"messages": [{"role": "user", "content": text}]})
    return records


PASSAGE_QUESTIONS = (
    "Explain the Python language topic `{topic}`.",
    "What does the Python reference say about `{topic}`?",
    "Tell me about `{topic}` in Python.",
)


def _unwrap(para: str) -> str:
    """A reference paragraph as a chat answer would write it: prose (every line at one indent) on one line, a code
    or grammar block (lines at several indents) dedented with its lines kept."""
    lines = [line.rstrip() for line in para.strip("\n").splitlines()]
    indents = {len(line) - len(line.lstrip()) for line in lines if line.strip()}
    if len(indents) <= 1:
        return " ".join(line.strip() for line in lines if line.strip())
    return textwrap.dedent("\n".join(lines))


def reference_passages(chars: int = 260) -> list[tuple[str, str]]:
    """(topic, passage) from the language reference (:mod:`pydoc_data.topics`): its paragraphs, neighbours merged up
    to ~`chars` characters (~64 tokens of English), longer ones cut at a sentence or word boundary."""
    from pydoc_data.topics import topics

    out = []
    for topic in sorted(topics):
        current = ""
        for para in re.split(r"\n\s*\n", topics[topic]):
            para = _unwrap(para)
            while len(para) > chars:  # a long paragraph: its head up to the last sentence (else word) end
                cut = para.rfind(". ", 0, chars)
                cut = cut + 1 if cut > chars // 3 else para.rfind(" ", 0, chars)
                cut = cut if cut > 0 else chars
                out.append((topic, para[:cut].strip()))
                para = para[cut:].strip()
            if current and len(current) + len(para) + 1 > chars:
                out.append((topic, current))
                current = ""
            current = f"{current}\n\n{para}".strip() if para.strip() else current
        if len(current) > 40:
            out.append((topic, current))
    return [(t, p) for t, p in out if len(p) > 40]


def reference_passage_records(n: int, seed: int = 0) -> list[dict]:
    """`n` chat records whose last turn is the assistant's: a language-reference passage answering a question about
    its topic (fewer if the reference holds fewer passages)."""
    rng = random.Random(seed + 1)
    passages = reference_passages()
    rng.shuffle(passages)
    return [{"messages": [{"role": "user", "content": rng.choice(PASSAGE_QUESTIONS).format(topic=topic)},
                          {"role": "assistant", "content": passage}]} for topic, passage in passages[:n]]


def write_stdlib_chat_prompts(path: str | Path, n: int, seed: int = 0, scored: int = 0) -> Path:
    """Write :func:`stdlib_chat_records` (and `scored` :func:`reference_passage_records`) as JSONL to `path`
    (atomically); returns the path."""
    records = stdlib_chat_records(n, seed) + reference_passage_records(scored, seed)
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return Path(path)
