"""The Python examples of a Markdown file (the README, the docs site's pages), as the tests
run them: every ```python block in order, as one script, leaving out the blocks that import
an optional library that is not installed (torch, transformers, ...)."""
import importlib.util
import re

# what an example needs at run time besides the library it imports (transformers' Trainer
# needs accelerate)
NEEDS = {"transformers": ("accelerate",)}


def python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, re.S)


def missing_libraries(block):
    """The libraries a block imports (or needs, NEEDS) that are not installed."""
    imported = re.findall(r"^(?:from|import) (\w+)", block, re.M)
    return sorted({name for top in imported for name in (top, *NEEDS.get(top, ()))
                   if importlib.util.find_spec(name) is None})


def runnable_blocks(text):
    """(the blocks that can run here, the libraries that the others lack)."""
    blocks, missing = [], set()
    for block in python_blocks(text):
        lacking = missing_libraries(block)
        missing.update(lacking)
        if not lacking:
            blocks.append(block)
    return blocks, sorted(missing)
